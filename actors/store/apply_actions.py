"""Applying an operator's action (``actors.store.actions``) to the tasks its selector
matches: partition by partition, in batches, each batch and its progress mark one script
in the partition's slot (``action_batch.lua``), paced to ``ActionSettings.rate``.

The applier holds the action's lease and renews it every third of it; a lease it finds
taken by another ends its work (``LeaseLost``). Each partition is resolved afresh
(``select_partition``) and applied from its mark on, so an applier that starts after
another died changes each task once: pause, resume, stop and delete change the task in
the script that moves the mark; a trigger appends in the stream's slot first, at most once
per action and task (``action_fires.lua`` says why), and a backfill through the backfill
markers (``actors.store.backfill``), then moves the mark with the outcomes.

Each task changed is logged as its single-task call logs it (``paused``, ``resumed``,
``stopped``, ``deleted``, ``triggered``, ``backfilled``, with ``action_id``); the applier
that finishes the action writes one ``tasks_action`` line with the counts.
"""

from __future__ import annotations

import typing
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from actors.domain.errors import InvalidTask, TaskNotFound
from actors.domain.model import Task, encode_payload
from actors.domain.schedules import Overlap
from actors.store import backfill as backfilling
from actors.store import backfill_window
from actors.store.action_scripts import BatchItem, BatchReply
from actors.store.actions import (
    DONE,
    MAX_FAILURES,
    RETENTION_MS,
    ActionSpec,
    ActionState,
    Progress,
    finish_action,
    read_action,
    renew_lease,
)
from actors.store.enqueue import enqueue_fires
from actors.store.flights import dropped_lines, with_origin
from actors.store.keys import schedule_id
from actors.store.manual_fires import (
    APPENDED,
    HELD,
    HELD_MARK,
    SKIPPED,
    check_overlap,
    fire_under,
    on_grid,
)
from actors.store.notes import encode_note
from actors.store.placement import paused_line, paused_skips, resume_point
from actors.store.replies import Fire
from actors.store.selection import Selector, readable_tasks, select_partition, sorted_after
from runtime.logging import emit_events

if TYPE_CHECKING:
    from actors.store.scripts import Scripts
    from actors.store.tasks import TaskStore

_ACTOR = "store"
_EVENTS = {"pause": "paused", "resume": "resumed", "stop": "stopped", "delete": "deleted"}


@attrs.frozen
class ActionSettings:
    """How actions are applied (``[actions]`` in node.toml)."""

    batch: int = 500
    """Tasks per script call (one partition's)."""
    rate: float = 5_000.0
    """Tasks a second at most, so an action shares Redis with the live fires."""
    lease_ms: int = 10_000
    """How long an applier's hold on an action outlives it."""
    backfill_max_fires: int = backfilling.DEFAULT_MAX_FIRES
    """The most fires one backfill action may hold, checked when this node's API takes it
    (``plan_backfill``); never a cut where it is applied (any node may apply it)."""
    backfill_rate: float = backfilling.DEFAULT_RATE


class LeaseLost(Exception):
    """Another applier holds the action now: this one stops."""


async def apply_action(
    store: TaskStore, action_id: str, holder: str, settings: ActionSettings
) -> ActionState:
    """Apply what is left of the action (``holder`` holds its lease), mark it done and
    log its summary; its state afterwards. Raises ``LeaseLost`` when another took it."""
    state = await read_action(store, action_id)
    if state is None:
        raise TaskNotFound(f"action {action_id!r}")
    if state.state == DONE:
        return state
    keys = await store.keys()
    pacer = backfilling.Pacer(settings.rate)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_lease, store, action_id, holder, settings.lease_ms)
            for partition in range(keys.partitions):
                await _apply_partition(store, state, partition, settings, pacer)
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # One failure (a lost lease, Redis away) is the caller's to handle as itself: an
        # exception group would slip past its ``except LeaseLost`` and ``ride_out``.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    if not await finish_action(store, action_id, holder):
        raise LeaseLost(action_id)
    done = await read_action(store, action_id)
    assert done is not None
    counts = done.counts()
    emit_events(
        _ACTOR,
        [("tasks_action", {
            "action_id": action_id, "action": done.spec.action,
            "selector": done.spec.selector.to_dict(), "key": done.key_id,
            "count": counts["count"], "changed": counts["changed"],
            "unchanged": counts["unchanged"], "failed": counts["failed_count"],
        })],
    )  # fmt: skip
    return done


async def _keep_lease(store: TaskStore, action_id: str, holder: str, lease_ms: int) -> None:
    while True:
        await trio.sleep(lease_ms / 3000)
        if not await store.client.ride_out(lambda: renew_lease(store, action_id, holder, lease_ms)):
            raise LeaseLost(action_id)


async def _apply_partition(
    store: TaskStore, state: ActionState, partition: int, settings: ActionSettings,
    pacer: backfilling.Pacer,
) -> None:  # fmt: skip
    """Apply the partition from its mark on; a mark moved by another applier is read
    again and applied from there."""
    keys = await store.keys()
    scripts = await store.scripts()
    progress_key = keys.action_progress(partition, state.action_id)
    while True:
        progress = Progress.decode(await store.client.execute("HGETALL", progress_key))
        if progress.done:
            return
        selected = await select_partition(store, state.spec.selector, partition)
        tasks = sorted_after(selected, progress.last)
        mark, moved = progress.last, False
        if not tasks:
            reply = await scripts.action_batch(
                partition, state.action_id, "mark", mark, [], final=True, note="",
                retention_ms=RETENTION_MS, max_failures=MAX_FAILURES,
            )  # fmt: skip
            moved = reply.moved is not None
        for i in range(0, len(tasks), settings.batch):
            chunk = tasks[i : i + settings.batch]
            await pacer.before(len(chunk))
            final = i + settings.batch >= len(tasks)
            # Read again just before it is applied: the partition was selected up to
            # seconds ago (paced), and a task since changed (resumed, retyped, updated)
            # must not be deleted or paused for what it was then, nor resumed or fired
            # from its old schedule and payload.
            fresh = await _still_matching(store, state.spec.selector, chunk)
            reply = await _batch(
                store, state, partition, mark, fresh, final, settings, chunk[-1].task_id
            )
            if reply.moved is not None:
                moved = True
                break
            mark = chunk[-1].task_id
        if not moved:
            return


async def _still_matching(
    store: TaskStore, selector: Selector, chunk: Sequence[Task]
) -> list[Task]:
    """``chunk``'s tasks as they are now, those the selector still matches (in order)."""
    found = await readable_tasks(store, [t.task_id for t in chunk])
    return [t for t in found if t is not None and selector.filter.matches(t)]


async def _batch(
    store: TaskStore, state: ActionState, partition: int, mark: str, chunk: Sequence[Task],
    final: bool, settings: ActionSettings, last: str,
) -> BatchReply:  # fmt: skip
    scripts = await store.scripts()
    spec = state.spec
    note = ""
    if spec.action in ("trigger", "backfill"):
        outcomes = await _fire(store, state, chunk, settings)
        items = [BatchItem(t.task_id, outcome=outcomes[t.task_id]) for t in chunk]
        action = "mark"
    else:
        now = await store.now_ms()
        if spec.note is not None:
            note = encode_note(spec.note, spec.action, now, state.key_id)
        items = (
            await _resumes(scripts, chunk, now)
            if spec.action == "resume"
            else [BatchItem(t.task_id) for t in chunk]
        )
        action = spec.action
    reply = await scripts.action_batch(
        partition, state.action_id, action, mark, items, final=final, note=note,
        retention_ms=RETENTION_MS, max_failures=MAX_FAILURES, last=last,
    )  # fmt: skip
    if reply.moved is None and action != "mark":
        _log_changes(state, chunk, items, reply)
    return reply


async def _resumes(scripts: Scripts, chunk: Sequence[Task], now: int) -> list[BatchItem]:
    """The batch's resumes: each task's next time, and the grid times its pause skipped
    after the latest one its flight decided. A cron's are walked (up to a thousand a
    task): the loop lets the node's other work run between tasks."""
    tracked = [t.task_id for t in chunk if t.schedule.overlap != "allow_all"]
    decided = await scripts.latest_decided(tracked)
    items = []
    for t in chunk:
        items.append(
            BatchItem(t.task_id, *resume_point(t, now), tracked=t.schedule.overlap != "allow_all",
                      version=t.updated_ms, paused=paused_skips(t, now, decided.get(t.task_id)))
        )  # fmt: skip
        if t.schedule.kind == "cron":
            await trio.lowlevel.checkpoint()
    return items


def _log_changes(
    state: ActionState, chunk: Sequence[Task], items: Sequence[BatchItem], reply: BatchReply
) -> None:
    spec = state.spec
    event = _EVENTS[spec.action]
    lines: list[tuple[str, dict[str, Any]]] = []
    for task, item, (code, status, dropped) in zip(chunk, items, reply.results, strict=True):
        if code != 1:
            continue
        fields: dict[str, Any] = {"task_id": task.task_id}
        if spec.action != "delete":
            fields["status"] = status
            if spec.note is not None:
                fields["note"] = spec.note
        fields["action_id"] = state.action_id
        lines.append((event, fields))
        if item.paused is not None:
            lines.append(paused_line(task, item.paused))
        lines += dropped_lines(task.task_id, task.type, dropped, "stopped")
    emit_events(_ACTOR, lines)


async def _fire(
    store: TaskStore, state: ActionState, chunk: Sequence[Task], settings: ActionSettings
) -> dict[str, str]:
    """A trigger's or backfill's appends for these tasks; per task, its outcome for the
    mark ('1' appended by this action, '0' nothing appended, else why it failed)."""
    spec = state.spec
    outcomes: dict[str, str] = {}
    ready: list[Task] = []
    verb = "triggered" if spec.action == "trigger" else "backfilled"
    for task in chunk:
        policy = typing.cast(Overlap, spec.overlap or "allow_all")
        if spec.action == "backfill":
            policy = typing.cast(Overlap, spec.overlap or task.schedule.overlap)
        try:
            if task.status == "stopped":
                raise InvalidTask(f"stopped (for good): it cannot be {verb}")
            check_overlap(task.task_id, task.schedule.overlap, policy, task.status)
        except InvalidTask as exc:
            outcomes[task.task_id] = str(exc).removeprefix("overlap: ")
            continue
        ready.append(task)
    if spec.action == "backfill":
        outcomes.update(await _backfill(store, state, ready, settings))
    else:
        outcomes.update(await _trigger(store, state, ready))
    return outcomes


async def _trigger(store: TaskStore, state: ActionState, tasks: Sequence[Task]) -> dict[str, str]:
    """One fire per task at the action's time (schedule_id ``task_id:created_ms``; the next
    millisecond for a task with a grid time then, whose fire's id it would share), at most
    once per action: ``allow_all`` ones appended per type in one call, the others through
    their overlap decision (``manual_fires.fire_under``) one task at a time."""
    scripts = await store.scripts()
    now = await store.now_ms()
    dues = {t.task_id: _trigger_time(t, state.created_ms) for t in tasks}
    overlap = typing.cast(Overlap, state.spec.overlap or "allow_all")
    outcomes: dict[str, str] = {}
    queued: dict[str, bool] = {}
    if overlap == "allow_all":
        by_type: dict[tuple[str, int], list[Task]] = defaultdict(list)
        for task in tasks:
            by_type[task.type, dues[task.task_id]].append(task)
        for (task_type, due), group in by_type.items():
            code = with_origin("", "t")  # a manual fire: its tasks' histories say so
            fires = [(t.task_id, encode_payload(t.payload), code) for t in group]
            flags = await scripts.action_fires(
                task_type, state.action_id, due, fires, now, RETENTION_MS
            )
            for task, appended in zip(group, flags, strict=True):
                outcomes[task.task_id] = "1"  # appended now, or by this action before
                if appended:
                    queued[task.task_id] = True
    else:
        keys = await store.keys()
        for task in tasks:
            marker = keys.action_fired(task.type, state.action_id)
            decided = await store.client.execute("HGET", marker, task.task_id)
            if decided is not None:
                # decided by this action before (its applier died before the mark): held
                # back ('h': its poller appends it, maybe has, and it has run), or appended
                # (it may have run and ended too). A decision now could start it again, and
                # append it twice: the earlier one stands, and is counted as it was.
                held = decided == HELD_MARK.encode()
                outcomes[task.task_id], queued[task.task_id] = ("0" if held else "1"), False
                continue

            due = dues[task.task_id]

            async def append(
                decided: Sequence[int], letter: str, task: Task = task, due: int = due
            ) -> list[bool]:
                # The overlap decision may start another fire than the action's own (one
                # waiting behind the fire that ended, or one in flight never confirmed):
                # each is appended under its own due time, the action's at most once.
                code, payload = with_origin(letter, "t"), encode_payload(task.payload)
                flags = []
                for d in decided:
                    if d == due:
                        flags += await scripts.action_fires(
                            task.type, state.action_id, due, [(task.task_id, payload, code)],
                            now, RETENTION_MS,
                        )  # fmt: skip
                    else:
                        fire = Fire(task.task_id, task.type, payload, d, policy=code)
                        await enqueue_fires(scripts, [fire], now, _ACTOR, dedupe_window_ms=0)
                        flags.append(True)
                return flags

            fates = await fire_under(scripts, task.task_id, task.type, [due], overlap, append,
                                     _ACTOR, store.takeover_ms, store.history)  # fmt: skip
            outcomes[task.task_id] = "0" if fates[due] in (HELD, SKIPPED) else "1"
            queued[task.task_id] = fates[due] == APPENDED
            if fates[due] in (HELD, SKIPPED):  # held: its poller appends it once the fire
                # ahead has ended, and a repeat of the batch must find it as this action's
                # (it may have run and ended by then, and its decision would start it
                # again); skipped: the action's decision for the task stands
                await _mark_held(store, task, state.action_id)
    emit_events(
        _ACTOR,
        [
            (
                "triggered",
                {
                    "task_id": task_id,
                    "schedule_id": schedule_id(task_id, dues[task_id]),
                    "queued": q,
                    "action_id": state.action_id,
                },
            )
            for task_id, q in queued.items()
        ],
    )
    return outcomes


async def _mark_held(store: TaskStore, task: Task, action_id: str) -> None:
    """Mark ``task``'s fire of the action, which its overlap policy held back or skipped,
    in the action's marker (``HELD_MARK``): a held fire is the task's flight record's from
    now on, its poller appends it; a skipped one was decided not to run; either way a
    repeat of the batch leaves the task be. A fire this action appended before keeps its
    mark (HSETNX)."""
    keys = await store.keys()
    marker = keys.action_fired(task.type, action_id)
    await store.client.pipeline(
        [("HSETNX", marker, task.task_id, HELD_MARK), ("PEXPIRE", marker, RETENTION_MS)]
    )


def _trigger_time(task: Task, action_ms: int) -> int:
    """A task's fire's time under a trigger action: the action's, or the next millisecond
    where that is a grid time of the task (the same on every repeat of the action)."""
    return action_ms + 1 if on_grid(task, action_ms) else action_ms


async def _backfill(
    store: TaskStore, state: ActionState, tasks: Sequence[Task], settings: ActionSettings
) -> dict[str, str]:
    """Each task's grid times of the window (``actors.store.backfill``: appended once per
    grid time however often repeated); '1' when some were appended now."""
    spec = state.spec
    assert spec.start_ms is not None
    assert spec.end_ms is not None
    pacer = backfilling.Pacer(settings.backfill_rate)
    outcomes: dict[str, str] = {}
    lines: list[tuple[str, dict[str, Any]]] = []
    now_ms = await store.client.time_ms()
    grids = await backfill_window.grids_of(store, tasks)
    for task in tasks:
        # Not this node's [api] bound: the action's fires were checked against the bound
        # of the node that took it, and a node without the API applies it too.
        fires = backfill_window.window_fires(
            task, spec.start_ms, spec.end_ms, backfilling.MOST_FIRES, now_ms,
            grids.get(task.task_id),
        )[: backfilling.MOST_FIRES]  # fmt: skip
        policy = typing.cast(Overlap, spec.overlap or task.schedule.overlap)
        fates = await backfilling.append_fires(store, task, fires, policy, pacer)
        enqueued = fates.count(APPENDED)
        outcomes[task.task_id] = "1" if enqueued else "0"
        lines.append(("backfilled", {
            "task_id": task.task_id, "type": task.type, "start_ms": spec.start_ms,
            "end_ms": spec.end_ms, "fires": len(fires), "enqueued": enqueued,
            "action_id": state.action_id,
        }))  # fmt: skip
    emit_events(_ACTOR, lines)
    return outcomes


async def plan_backfill(store: TaskStore, spec: ActionSpec, max_fires: int) -> int:
    """A backfill's fires over every task its selector matches now: InvalidTask (nothing
    written) past ``max_fires`` or for a window that is not past."""
    assert spec.start_ms is not None
    assert spec.end_ms is not None
    now_ms = await store.client.time_ms()
    backfill_window.check_window(spec.start_ms, spec.end_ms, now_ms)
    keys = await store.keys()
    total = 0
    for partition in range(keys.partitions):
        selected = await select_partition(store, spec.selector, partition)
        grids = await backfill_window.grids_of(store, selected)
        for task in selected:
            if task.status == "stopped":
                continue
            total += len(backfill_window.window_fires(task, spec.start_ms, spec.end_ms,
                                                      max_fires - total, now_ms,
                                                      grids.get(task.task_id)))  # fmt: skip
            if total > max_fires:
                raise InvalidTask(
                    f"end_ms: the window holds more than {max_fires} fires of the selected "
                    "tasks, the most one backfill may enqueue ([api] backfill_max_fires): "
                    "backfill shorter windows or fewer tasks"
                )
    return total
