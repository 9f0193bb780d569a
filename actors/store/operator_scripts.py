"""The operators' scripts: purging a queue, replaying dead letters, backfilling a past
window, a trigger's time. A part of ``actors.store.scripts.Scripts``; nothing else uses it alone."""

from __future__ import annotations

from collections.abc import Sequence

from actors.store import lua
from actors.store.codes import flag
from actors.store.flights import (
    ENDED_DROPPED,
    FlightEnd,
    FlightScripts,
    ended_flights,
)
from actors.store.keys import GROUP, SEEN_ATTEMPTS

#: How long a task's last trigger time is kept: far longer than two API nodes' clocks
#: differ, or than a burst of triggers in one millisecond moves it ahead of the clock.
TRIGGER_KEEP_MS = 60_000


class OperatorScripts(FlightScripts):
    """The scripts the API calls for operators, as typed async methods."""

    # -- operators --------------------------------------------------------------------------

    async def purge_queue(
        self, task_type: str, upto: str, count: int, *, look: bool = False
    ) -> tuple[int, list[FlightEnd], str]:
        """``purge_queue.lua``: delete up to ``count`` undelivered messages with ids up to
        ``upto`` (``look``: only find them); how many, the flights of tasks with a policy
        they end, and the last id (``''`` = none)."""
        keys = [self.keys.queue(task_type), self.keys.cancels(task_type)]
        args = [GROUP, upto, count, "1" if look else ""]
        ((n, ended, last),) = await self._run([(lua.PURGE_QUEUE, keys, args)])
        return int(n), ended_flights(ended, ENDED_DROPPED), last.decode()

    async def trigger_time(self, task_id: str, now_ms: int) -> int:
        """``trigger_time.lua``: a manual trigger's due time, ``now_ms`` or 1 ms past the
        task's last trigger time when that is not earlier (``TRIGGER_KEEP_MS``)."""
        key = self.keys.trigger_time(task_id)
        (t,) = await self._run([(lua.TRIGGER_TIME, [key], [now_ms, TRIGGER_KEEP_MS])])
        return int(t)

    async def replay_dead(
        self, task_type: str, entry_ids: Sequence[str]
    ) -> list[tuple[str, str | None]]:
        """``replay_dead.lua``: per entry, (the new stream id or ``REPLAY_MISSING`` /
        ``REPLAY_MALFORMED`` (``actors.store.codes``), the entry's task id or None)."""
        k = self.keys
        ((outcomes, task_ids),) = await self._run(
            [
                (
                    lua.REPLAY_DEAD,
                    [k.queue(task_type), k.dlq(task_type)],
                    [task_type, k.seen_prefix(task_type), *entry_ids],
                )
            ]
        )
        return [
            (as_str(outcome), as_str(task_id) or None)
            for outcome, task_id in zip(outcomes, task_ids, strict=True)
        ]

    async def backfill(
        self, task_type: str, task_id: str, payload: str, due_times: Sequence[int],
        now_ms: int, retention_ms: int, policy: str = "", created_ms: int = 0,
    ) -> list[bool]:  # fmt: skip
        """``backfill.lua``: append a task's grid times not backfilled before (one call;
        the caller keeps it to ``ENQUEUE_CHUNK`` times); per time, True if appended.
        ``policy``: the messages' policy code ('' = none); ``created_ms``: the task's,
        kept in its marker (``backfill.BORN``)."""
        k = self.keys
        args = [now_ms, task_type, task_id, payload, retention_ms,
                flag(k.compact_messages), policy, created_ms, k.seen_prefix(task_type),
                SEEN_ATTEMPTS, *due_times]  # fmt: skip
        (flags,) = await self._run(
            [(lua.BACKFILL, [k.queue(task_type), k.backfilled(task_type, task_id)], args)]
        )
        return [bool(int(flag)) for flag in flags]


def as_str(value: bytes | str | int) -> str:
    """A script reply element as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
