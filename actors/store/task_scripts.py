"""The task store's scripts (create, update, status, delete, migrate), and the machinery
every script call shares. ``actors.store.scripts.Scripts`` adds the roles' scripts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from actors.store import lua
from actors.store.codes import flag
from actors.store.keys import Keys
from actors.store.placement import KeptGrid
from actors.store.replies import TaskRow
from runtime.redis_io import RedisClient, Reply, Script
from runtime.redis_replies import PartRejected, rejected_alone

Call = tuple[Script, list[Any], list[Any]]


def raise_first_error(replies: Iterable[Reply]) -> None:
    """Raise the first reply that is an error (a failed call of a pipeline), if any."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def set_apart(
    parts: Sequence[int], replies: list[Reply], rejected: list[PartRejected] | None
) -> tuple[list[int], list[Reply]]:
    """With ``rejected`` (else as they are): the partitions and replies of the calls to go
    on with, each call Redis rejected (``rejected_alone``: its partition's keys of another
    kind) put in ``rejected`` as ``PartRejected`` naming its partition in ``parts``."""
    if rejected is None or not any(rejected_alone(r) for r in replies):
        return list(parts), replies
    kept: list[int] = []
    out: list[Reply] = []
    for p, r in zip(parts, replies, strict=True):
        if rejected_alone(r):
            rejected.append(PartRejected(p, r))
        else:
            kept.append(p)
            out.append(r)
    return kept, out


def _kept_args(kept: KeptGrid | None, read: bytes) -> tuple[bytes | int | str, ...]:
    """``update_task.lua``'s ARGV[10..18]: the grid kept (or '' for another grid) and the
    schedule the update was placed from."""
    if kept is None:
        return ("",) * 7 + (read, "")
    return (
        flag(True), kept.delay_ms, or_empty(kept.end_ms), or_empty(kept.max_runs),
        or_empty(kept.revive_ms), or_empty(kept.revive_score), kept.fires, read,
        flag(kept.ended),
    )  # fmt: skip


def or_empty(value: int | None) -> int | str:
    """Scripts read '' as "none" for an optional time."""
    return "" if value is None else value


def parse_times(text: bytes) -> list[int]:
    """A script's comma-separated due times ('' = none); what is not one (a flight record
    edited by hand, whose time a script hands back) is left out rather than failing the
    caller after the script wrote its change."""
    return [t for t in map(parse_time, text.split(b",")) if t is not None]


def parse_time(text: bytes) -> int | None:
    """A script's due time ('' or not a number: None)."""
    try:
        return int(text) if text else None
    except ValueError:
        return None


class TaskScripts:
    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def _run(self, calls: list[Call]) -> list[Reply]:
        """Pipeline the calls; raise the first that failed (its error object), else the
        replies in order."""
        if not calls:
            return []
        replies = await self.client.mixed_scripts(calls)
        raise_first_error(replies)
        return replies

    async def keep_meta(self, meta: str, fields: Sequence[Any]) -> bool:
        """``keep_meta.lua``: write the meta key whole if it is gone; whether it was."""
        (wrote,) = await self._run([(lua.KEEP_META, [meta], list(fields))])
        return bool(wrote)

    async def create_tasks(self, rows: dict[int, list[TaskRow]]) -> dict[int, list[int]]:
        """``create_tasks.lua`` per partition; per task a ``Code`` (OK, UNCHANGED, CONFLICT)."""
        k = self.keys
        calls: list[Call] = []
        for partition, items in rows.items():
            args: list[Any] = [k.tag(partition)]
            for r in items:
                args += [r.task_id, k.bucket_of(r.task_id), r.type, r.payload_json, r.sched,
                         or_empty(r.next_ms), or_empty(r.score), r.labels_json]  # fmt: skip
            calls.append((lua.CREATE_TASKS, [k.schedule(partition)], args))
        replies = await self._run(calls)
        return {p: [int(c) for c in r] for p, r in zip(rows, replies, strict=True)}

    async def update_task(
        self, task_id: str, payload_json: str, sched: bytes | str, next_ms: int | None,
        score: int | None, labels_json: str = "", tracked: bool = False,
        kept: KeptGrid | None = None, read: bytes = b"",
    ) -> tuple[int, str, bool, list[int], str]:  # fmt: skip
        """``update_task.lua``: replace payload, schedule and/or labels ('' keeps one;
        labels '{}' removes them all); ``tracked``: the new schedule has an overlap
        policy (without one, the fires its former one held back go, with its flight
        record); ``kept``: the new schedule is on the task's grid (``next_ms`` and
        ``score`` place it otherwise); ``read``: the task's schedule the placement was made from
        (``Code.CONFLICT`` when another update has replaced it: nothing done); (``Code``, status
        afterwards, whether a schedule other than the task's took effect: one sent as it
        is changes nothing, the due times of the waiting fires that went, the task's
        type)."""
        k, p = self.keys, self.keys.partition_of(task_id)
        (reply,) = await self._run(
            [
                (
                    lua.UPDATE_TASK,
                    [k.schedule(p)],
                    [
                        k.tag(p),
                        task_id,
                        k.bucket_of(task_id),
                        payload_json,
                        sched,
                        or_empty(next_ms),
                        or_empty(score),
                        labels_json,
                        flag(tracked),
                        *_kept_args(kept, read),
                    ],
                )
            ]
        )
        if len(reply) < 5:  # not found
            return int(reply[0]), reply[1].decode(), False, [], ""
        code, status, placed, dropped, task_type = reply
        return (
            int(code),
            status.decode(),
            bool(int(placed)),
            parse_times(dropped),
            task_type.decode(),
        )

    async def set_status(
        self, task_id: str, action: str, next_ms: int | None = None, score: int | None = None,
        note: str = "", tracked: bool = False, version: int | None = None,
        skipped: tuple[int, int] | None = None,
    ) -> tuple[int, str, list[int], str]:  # fmt: skip
        """``set_status.lua``: pause, resume (at ``next_ms``) or stop, keeping ``note``
        (``actors.store.notes``; '' = none) with the change; ``tracked``: the task's
        schedule has an overlap policy (a resume keeps it scheduled for the fires its
        flight holds); ``version``: the task's version a resume's ``next_ms`` was placed
        from (``Code.CONFLICT`` when another write moved it); (``Code``, status, the due
        times of the waiting fires a stop dropped: ``drop_waiting`` in ``flight.lua``, and
        the task's type when it did). ``skipped``: a resume's count and last of the grid
        times the pause skipped, noted not run (``placement.paused_skips``)."""
        k, p = self.keys, self.keys.partition_of(task_id)
        ((code, status, dropped, task_type),) = await self._run(
            [
                (
                    lua.SET_STATUS,
                    [k.schedule(p)],
                    [
                        k.tag(p),
                        task_id,
                        k.bucket_of(task_id),
                        action,
                        or_empty(next_ms),
                        or_empty(score),
                        note,
                        flag(tracked),
                        or_empty(version),
                        "" if skipped is None else f"{skipped[0]}:{skipped[1]}",
                    ],
                )
            ]
        )
        return int(code), status.decode(), parse_times(dropped), task_type.decode()

    async def delete_tasks(self, task_ids: Iterable[str], of_type: str = "") -> int:
        """``delete_tasks.lua`` per partition; how many existed. ``of_type``: the type
        whose index named the ids (a clear of the type): a task of another type is left,
        and the index's entry for it goes."""
        k = self.keys
        groups: dict[int, list[Any]] = defaultdict(list)
        for task_id in task_ids:
            groups[k.partition_of(task_id)] += [task_id, k.bucket_of(task_id)]
        calls: list[Call] = [
            (lua.DELETE_TASKS, [k.schedule(p)], [k.tag(p), of_type, *args])
            for p, args in groups.items()
        ]
        return sum(int(r) for r in await self._run(calls))

    async def migrate_tasks(
        self,
        partition: int,
        type_set: str,
        task_type: str,
        rows: Sequence[tuple[str, Sequence[Any]]],
    ) -> int:
        """``migrate_tasks.lua``: move layout-1 tasks (id, (definition, state, error)) of one
        type set into this layout; how many moved."""
        k = self.keys
        args: list[Any] = [k.tag(partition), type_set]
        for task_id, converted in rows:
            args += [task_id, k.bucket_of(task_id), task_type, *converted]
        (moved,) = await self._run([(lua.MIGRATE_TASKS, [k.schedule(partition)], args)])
        return int(moved)
