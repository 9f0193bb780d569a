"""The scripts of operators' actions over selected tasks: a batch and its progress mark
(``action_batch.lua``), a trigger's appends at most once per action (``action_fires.lua``),
the action's record and lease (``action_lease.lua``). A part of
``actors.store.scripts.Scripts``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from actors.store import lua
from actors.store.codes import flag
from actors.store.task_scripts import TaskScripts, or_empty, parse_times

#: ``action_batch.lua``'s answer when the partition's mark is not the one the caller read.
MARK_MOVED = -9


@attrs.frozen
class BatchItem:
    """One task of a batch: its id, a resume's next grid time and score and whether the
    task has an overlap policy (``tracked``: the resume keeps it scheduled for the fires
    its flight holds), and for a ``mark`` batch the outcome the caller decided ('1'
    changed, '0' unchanged, else why it failed)."""

    task_id: str
    next_ms: int | None = None
    score: int | None = None
    outcome: str = ""
    tracked: bool = False
    version: int | None = None
    """A resume's: the task's version its next time was placed from (another write since
    fails the task's resume, ``action_batch.lua``)."""
    paused: tuple[int, int] | None = None
    """A resume's: how many grid times the pause skipped and the last of them
    (``actors.domain.misfires.paused_past``), noted not run; None: none."""


@attrs.frozen
class BatchReply:
    """Per task (in order): code (1 changed, 0 unchanged, < 0 failed), status or reason,
    and the due times of the waiting fires a stop dropped (``drop_waiting`` in
    ``flight.lua``); or ``moved`` with the mark found, when the caller's was stale."""

    results: list[tuple[int, str, list[int]]]
    moved: str | None = None


class ActionScripts(TaskScripts):
    async def action_batch(
        self, partition: int, action_id: str, action: str, expect: str, items: Sequence[BatchItem],
        *, final: bool, note: str, retention_ms: int, max_failures: int, last: str = "",
    ) -> BatchReply:  # fmt: skip
        """``action_batch.lua``: apply ``action`` (or ``mark``) to these tasks of one
        partition and move its mark from ``expect`` to ``last`` (the batch's last id,
        whether or not it still matched; '': the last of ``items``), in one script."""
        k = self.keys
        args: list[Any] = [
            k.tag(partition), action, expect, last or (items[-1].task_id if items else ""),
            "1" if final else "", note, retention_ms, max_failures,
        ]  # fmt: skip
        for item in items:  # a group's last field: a mark's outcome, or a resume's tracked
            last_field = item.outcome or flag(item.tracked)
            if item.version is not None or item.paused is not None:
                last_field = f"{last_field}:{or_empty(item.version)}"
            if item.paused is not None:
                last_field = f"{last_field}:{item.paused[0]}:{item.paused[1]}"
            args += [item.task_id, k.bucket_of(item.task_id), or_empty(item.next_ms),
                     or_empty(item.score), last_field]  # fmt: skip
        keys = [k.schedule(partition), k.action_progress(partition, action_id)]
        (reply,) = await self._run([(lua.ACTION_BATCH, keys, args)])
        if int(reply[0]) == MARK_MOVED:
            return BatchReply([], _text(reply[1]))
        flat = reply[1:]
        return BatchReply(
            [
                (int(flat[i]), _text(flat[i + 1]), parse_times(flat[i + 2]))
                for i in range(0, len(flat), 3)
            ]
        )

    async def action_fires(
        self, task_type: str, action_id: str, due_ms: int, fires: Sequence[tuple[str, str, str]],
        now_ms: int, retention_ms: int,
    ) -> list[bool]:  # fmt: skip
        """``action_fires.lua``: append one fire per (task_id, payload, policy code) unless
        this action appended it before; per fire, True if appended now."""
        k = self.keys
        args: list[Any] = [now_ms, task_type, due_ms, flag(k.compact_messages),
                           retention_ms]  # fmt: skip
        for fire in fires:
            args += list(fire)
        keys = [k.queue(task_type), k.action_fired(task_type, action_id)]
        (flags,) = await self._run([(lua.ACTION_FIRES, keys, args)])
        return [bool(int(f)) for f in flags]

    async def action_lease(
        self, action_id: str, op: str, holder: str, lease_ms: int, retention_ms: int, *extra: Any
    ) -> list[Any]:
        """``action_lease.lua``: create, take, renew or finish an action's record."""
        k = self.keys
        keys = [k.action_record(action_id), k.actions_open]
        (reply,) = await self._run(
            [(lua.ACTION_LEASE, keys, [op, holder, lease_ms, retention_ms, *extra])]
        )
        return [_text(r) if isinstance(r, bytes) else r for r in reply]


def _text(value: Any) -> str:
    """A reply's text; bytes that are not UTF-8 (another program's record) replaced."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
