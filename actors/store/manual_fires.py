"""Fires an operator asks for (a trigger, a backfill) under an overlap policy of the call.

A manual fire under ``allow_all`` is appended as it is and ends no task's flight. Under
any other policy it goes through ``overlap.lua`` like a grid time, in the order given:
it starts, waits behind the task's fire in flight (released as that one ends), is
skipped, or replaces it (``cancel_other``). Its message carries the policy's letter alone:
no catch-up window (an operator's fire is never too late) and no failure count.
"""

from __future__ import annotations

import secrets
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from actors.domain.errors import InvalidTask, InvalidTransition, TaskNotFound
from actors.domain.model import encode_payload
from actors.domain.schedules import Overlap, Schedule
from actors.store.enqueue import enqueue_fires
from actors.store.flights import (
    ENDED_DROPPED,
    LETTERS,
    Decision,
    FlightEnd,
    Planned,
    with_origin,
)
from actors.store.keys import schedule_id
from actors.store.replies import Fire
from actors.store.scripts import Scripts
from runtime.logging import emit_events

if TYPE_CHECKING:
    from actors.domain.model import Task
    from actors.store.tasks import TaskStore

#: A manual fire's fate: appended now, found appended by an earlier call, held back by the
#: overlap policy (waiting behind the fire in flight: it starts once that one has ended),
#: or skipped by it (not run: a ``not_run`` line).
APPENDED, DUPLICATE, HELD, SKIPPED = "appended", "duplicate", "held", "skipped"
#: Appends fires of one task (due times, policy letter) and says, per fire, if appended.
Append = Callable[[Sequence[int], str], Awaitable[list[bool]]]

#: A marker's value for a fire its call's overlap policy held back (``append_once.lua``):
#: its poller appends it; a repeat of the call leaves it be.
HELD_MARK = "h"

#: How an operator's call's token begins (a poller's or retry dispatcher's is hex digits
#: and its tick, never this): ``overlap.lua`` appends a fire such a call left in flight
#: unconfirmed as a manual one, with the policy's letter alone.
MANUAL_TOKEN = "manual-"

#: What a call may ask of a task whose own overlap is ``allow_all``: its fires wait for
#: nothing (no poller releases a waiting fire of such a task), so only these.
WITHOUT_POLICY = ("allow_all", "skip")


def check_overlap(task_id: str, own: Overlap, overlap: Overlap, status: str = "active") -> None:
    """InvalidTask unless a call's ``overlap`` can apply to a task whose own is ``own``
    and whose status is ``status``. A policy that holds fires back needs a poller to start
    them once the fire ahead has ended: the task's own policy tracks its fires, and the
    task is not finished (no poller claims a finished task; a paused one's start when it
    resumes, its grid ended meanwhile or not: the resume parks it until they have)."""
    if overlap not in typing.get_args(Overlap):  # a store script's typo: no KeyError later
        allowed = ", ".join(typing.get_args(Overlap))
        raise InvalidTask(f"overlap: must be one of {allowed}, got {overlap!r}")
    if overlap in WITHOUT_POLICY:
        return
    if own == "allow_all":
        raise InvalidTask(
            f"overlap: {overlap} holds fires back until the one in flight ends, which needs "
            f"the task to have an overlap policy of its own; task {task_id!r} has allow_all "
            f"(set schedule.overlap, or use {' or '.join(WITHOUT_POLICY)})"
        )
    if status == "finished":
        raise InvalidTask(
            f"overlap: {overlap} holds fires back until the one in flight ends, and task "
            f"{task_id!r} is finished: no poller claims it to start them (use "
            f"{' or '.join(WITHOUT_POLICY)})"
        )


async def fire_under(
    scripts: Scripts, task_id: str, task_type: str, dues: Sequence[int], overlap: Overlap,
    append: Append, actor: str, takeover_ms: int, history: int,
) -> dict[int, str]:  # fmt: skip
    """Per due time of ``dues``, its fate (``APPENDED``, ``DUPLICATE``, ``HELD``,
    ``SKIPPED``). ``append`` writes the messages (the trigger's or backfill's way). The
    caller has checked ``overlap`` against the task's own (``check_overlap``).
    ``takeover_ms``: how old a poller's (or another call's) unconfirmed fire must be
    before this call appends it again, taking its decider as dead: the pollers' claim
    lease (``TaskStore``'s; a poller alive is on its way to its append until then).
    ``history``: the occurrences kept per task (``[scheduler] history``): grid times this
    call's fire displaces go into the ring."""
    letter = LETTERS[overlap]
    if letter == "A":
        flags = await append(dues, "")
        return {d: APPENDED if f else DUPLICATE for d, f in zip(dues, flags, strict=True)}
    partition = scripts.keys.partition_of(task_id)
    # A token of this call: the decision is confirmed once the append went through; left
    # unconfirmed (the call died), a decision about the task a claim lease later appends it.
    token = f"{MANUAL_TOKEN}{secrets.token_hex(6)}"
    planned = {partition: [Planned(task_id, letter, list(dues), task_type=task_type)]}
    decisions = await scripts.decide_overlaps(
        token, planned, grid=False, history=history, takeover_ms=takeover_ms
    )
    decision = decisions[task_id]
    if decision.cancel:
        sids = [schedule_id(task_id, d) for d in decision.cancel]
        await scripts.cancel_fires({task_type: sids})
    _log_skipped(task_id, task_type, decision, actor)
    run = [d for d, _ in decision.run]
    flags = await append(run, letter) if run else []
    if run:
        await scripts.confirm_flights(token, [task_id])
    dropped = [
        FlightEnd(task_id, ENDED_DROPPED, d)
        for (d, fresh), flag in zip(decision.run, flags, strict=True)
        if fresh and not flag
    ]
    if dropped:  # appended by an earlier call: that copy has run, or runs, on its own
        await scripts.end_flights(dropped)
    fates = {d: APPENDED if f else DUPLICATE for d, f in zip(run, flags, strict=True)}
    skipped = set(decision.skipped)
    return {d: fates.get(d, SKIPPED if d in skipped else HELD) for d in dues}


def _log_skipped(task_id: str, task_type: str, decision: Decision, actor: str) -> None:
    lines: list[tuple[str, dict[str, Any]]] = []
    for due in decision.skipped:
        fields: dict[str, Any] = {
            "task_id": task_id, "schedule_id": schedule_id(task_id, due), "type": task_type,
            "due_ms": due, "reason": "overlap",
        }  # fmt: skip
        if decision.blocking is not None:
            fields["blocking"] = schedule_id(task_id, decision.blocking)
        lines.append(("not_run", fields))
    if lines:
        emit_events(actor, lines)


async def trigger(store: TaskStore, task_id: str, overlap: Overlap, actor: str) -> tuple[str, bool]:
    """Run a task now, once, outside its schedule (which is left as it is); returns the
    fire's schedule_id and whether it was queued now (``overlap`` other than
    ``allow_all``: it may wait behind the task's fire in flight, or be skipped:
    ``fire_under``). A paused or finished task can be triggered (a
    manual run is an explicit request); a stopped one cannot: stopping is for good
    (InvalidTransition). The status is read before the enqueue, so a stop racing a
    trigger may let that one manual fire through."""
    task = await store.get(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    if task.status == "stopped":
        raise InvalidTransition(f"task {task_id!r} is stopped (for good): it cannot be triggered")
    check_overlap(task_id, task.schedule.overlap, overlap, task.status)
    now = await store.now_ms()
    payload = encode_payload(task.payload)
    scripts = await store.scripts()
    # A time of its own: not another trigger's (the same millisecond), nor a grid time's,
    # whose schedule_id it would share (the next millisecond is none: a grid of 1 ms aside).
    due = await scripts.trigger_time(task_id, now)
    if on_grid(task, due):
        due = await scripts.trigger_time(task_id, due + 1)

    async def append(dues: Sequence[int], policy: str) -> list[bool]:
        code = with_origin(policy, "t")
        fires = [Fire(task_id, task.type, payload, d, policy=code) for d in dues]
        await enqueue_fires(scripts, fires, now, actor, dedupe_window_ms=0)
        return [True] * len(fires)

    queued = await fire_under(
        scripts, task_id, task.type, [due], overlap, append, actor, store.takeover_ms,
        store.history,
    )  # fmt: skip
    fate = queued[due] == APPENDED
    sid = schedule_id(task_id, due)
    emit_events(actor, [("triggered", {"task_id": task_id, "schedule_id": sid, "queued": fate})])
    return sid, fate


def on_grid(task: Task, due_ms: int) -> bool:
    """Whether ``due_ms`` is one of the task's grid times (as the task is now): a manual
    fire then would share its schedule_id."""
    anchor = task.next_run_ms if task.next_run_ms is not None else task.schedule.start_ms
    return is_grid_time(task.schedule, anchor, due_ms)


def is_grid_time(s: Schedule, anchor_ms: int | None, due_ms: int) -> bool:
    """Whether ``due_ms`` is a grid time of ``s``, an interval's grid through ``anchor_ms``
    (one of its times; None: unknown, and no time is). A trigger's time never is (it
    moves off the grid: ``trigger``), a backfill's always is."""
    if s.kind == "interval":
        return anchor_ms is not None and (due_ms - anchor_ms) % s.interval_ms() == 0
    if s.kind == "cron":
        return s.next_after(due_ms - 1) == due_ms
    return due_ms == s.at_ms
