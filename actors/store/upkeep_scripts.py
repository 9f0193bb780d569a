"""The execution roles' upkeep scripts: the consumer's leases and name, taking back what a
consumer of its name left pending, and the claimer's reclaim, poison ends, prune and
trim. Called by the round, not by the fire (the fires' own: ``execution_scripts``). A part
of ``actors.store.scripts.Scripts``; nothing else uses it alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from msgpack import packb, unpackb

from actors.store import lua
from actors.store.flights import (
    ENDED_DEAD,
    LETTER_OF_ORIGIN,
    FlightEnd,
    FlightScripts,
    ended_flights,
    origin_of,
    with_origin,
)
from actors.store.keys import GROUP
from actors.store.messages import flat_fields
from actors.store.replies import OutcomeWrite, Reclaim, Reclaimed
from actors.store.task_scripts import or_empty

#: Most stream entries one ``trim_acked.lua`` call drops (whole listpack nodes of ~100: a
#: call frees ~1,000 nodes, well under a millisecond); ``trim_acked`` repeats it while
#: it takes some, so a stream is trimmed to its acknowledged head at any rate.
TRIM_STEP = 100_000
#: The error line of a poison message's history entry.
POISON_LINE = (
    "poison: delivered too many times without finishing (its handler kills or hangs its process)"
)
#: Most such calls one ``trim_acked`` makes (the rest waits for the claimer's next round).
TRIM_CALLS = 20
#: Most messages one ``release.lua`` call hands back (an XCLAIM each, a few ms in all);
#: ``release`` calls it again while a call hands back that many.
RELEASE_BATCH = 10_000


class UpkeepScripts(FlightScripts):
    """The consumers' and claimer's upkeep scripts, as typed async methods."""

    async def renew_leases(self, task_type: str, consumer: str, ids: Sequence[str]) -> list[str]:
        """``renew_leases.lua``: reset the idle time of our own in-flight messages."""
        if not ids:
            return []
        (renewed,) = await self._run(
            [(lua.RENEW_LEASES, [self.keys.queue(task_type)], [GROUP, consumer, *ids])]
        )
        return [i.decode() for i in renewed]

    async def release(
        self, task_type: str, consumer: str, idle_ms: int, batch: int = RELEASE_BATCH
    ) -> tuple[list[str], bool]:
        """``release.lua``: hand back everything pending under ``consumer`` with ``idle_ms``,
        ``batch`` ids a call (one script call holds Redis for its whole batch); (released ids,
        whether the consumer left the group: not while its claimer's poison ends wait, which
        the pruner takes over only from a consumer still in the group)."""
        keys = [self.keys.queue(task_type), self.keys.poison_ends(task_type, consumer)]
        released: list[str] = []
        start = "-"
        while True:
            ((ids, removed),) = await self._run(
                [(lua.RELEASE, keys, [GROUP, consumer, idle_ms, start, batch])]
            )
            released += (i.decode() for i in ids)
            if len(ids) < batch:
                return released, bool(int(removed))
            start = "(" + released[-1]

    async def own_name(
        self, task_type: str, consumer: str, owner: str, ttl_ms: int, take_from: str = ""
    ) -> tuple[bool, str | None]:
        """``own_name.lua``: (True, None) when ``consumer`` is now ours for ``ttl_ms``, else
        (False, the holder's owner value)."""
        (reply,) = await self._run(
            [(lua.OWN_NAME, [self.keys.owner(task_type, consumer)], [owner, ttl_ms, take_from])]
        )
        return (True, None) if int(reply[0]) else (False, reply[1].decode())

    async def disown_name(self, task_type: str, consumer: str, owner: str) -> bool:
        """``disown_name.lua``: give the name up if it is still ours."""
        (reply,) = await self._run(
            [(lua.DISOWN_NAME, [self.keys.owner(task_type, consumer)], [owner])]
        )
        return bool(int(reply))

    async def node_number(self, node: str) -> int:
        """``node_number.lua``: the number ``node``'s name goes by in task histories."""
        (number,) = await self._run([(lua.NODE_NUMBER, [self.keys.node_numbers], [node])])
        return int(number)

    async def recover(
        self, task_type: str, consumer: str, count: int, min_idle_ms: int = 0,
        max_deliveries: int | None = None,
    ) -> list[Reclaimed]:  # fmt: skip
        """``recover.lua``: claim back what is pending under ``consumer`` with at least
        ``min_idle_ms`` of idle time (idle reset), each with its deliveries. With
        ``max_deliveries`` (a consumer's start) one delivered that many times already is
        left to the claimer as poison, one delivered ``max_deliveries`` - 2 times or more
        is a suspect to run alone (``Reclaimed.alone``: counted by ``count_delivery`` as
        it starts), and each other counts as delivered once more; without, counts are
        kept."""
        args = [
            GROUP,
            consumer,
            count,
            min_idle_ms,
            "" if max_deliveries is None else max_deliveries,
        ]
        (entries,) = await self._run([(lua.RECOVER, [self.keys.queue(task_type)], args)])
        return [
            Reclaimed(msg_id.decode(), consumer, 0, int(count), flat_fields(fields), alone == 1)
            for msg_id, fields, count, alone in entries
        ]

    async def count_delivery(
        self, task_type: str, consumer: str, msg_id: str, deliveries: int
    ) -> int:
        """``count_delivery.lua``: one delivery more for a suspect about to run alone, from
        the ``deliveries`` ``recover`` gave it (repeated, it counts once); its deliveries
        now, or 0 when it is no longer pending under ``consumer``."""
        args = [GROUP, consumer, msg_id, deliveries]
        (count,) = await self._run([(lua.COUNT_DELIVERY, [self.keys.queue(task_type)], args)])
        return int(count)

    # -- execution: claimer -----------------------------------------------------------------

    async def reclaim(
        self, task_type: str, consumer: str, lease_ms: int, count: int, max_deliveries: int,
        node: str, sent_ms: int | None = None, max_delay_ms: int = 0,
    ) -> Reclaim:  # fmt: skip
        """``reclaim.lua``: take over up to ``count`` messages idle past the lease for
        ``consumer``; dead-letter those delivered ``max_deliveries`` times (poison).
        ``sent_ms``: the caller's reading of Redis's clock as it sends the call; when the
        call runs more than ``max_delay_ms`` later (Redis paused or stalled in between),
        it takes nothing (``Reclaim.stalled``)."""
        k = self.keys
        args = [GROUP, consumer, lease_ms, count, max_deliveries, node, task_type]
        args += [or_empty(sent_ms), max_delay_ms]
        keys = [k.queue(task_type), k.dlq(task_type), k.poison_ends(task_type, consumer),
                k.cancels(task_type)]  # fmt: skip
        ((claimed, poisoned, stalled, now_ms, held),) = await self._run([(lua.RECLAIM, keys, args)])
        return Reclaim(
            claimed=[
                Reclaimed(
                    msg_id.decode(), owner.decode(), int(idle), int(deliveries), flat_fields(fields)
                )
                for msg_id, owner, idle, deliveries, fields in claimed
            ],
            poisoned=[m.decode() for m in poisoned],
            stalled=bool(int(stalled)),
            now_ms=int(now_ms),
            held=held.decode() if isinstance(held, bytes) else str(held or ""),
        )  # fmt: skip

    async def poison_ends(
        self, task_type: str, consumer: str
    ) -> dict[int | None, tuple[list[bytes], list[FlightEnd], list[OutcomeWrite]]]:
        """The poison ends ``reclaim.lua`` left for ``consumer``'s claimer, by the partition
        of their task (each partition's written apart): (their ids, the flights to end, the
        outcomes to record); None: entries not written by it, nothing to do but drop them.
        Done, they are dropped with ``forget_poison_ends``; read again until then."""
        raw = await self.client.execute("HGETALL", self.keys.poison_ends(task_type, consumer))
        flat: dict[int | None, list[Any]] = {}
        out: dict[int | None, tuple[list[bytes], list[FlightEnd], list[OutcomeWrite]]] = {}
        for msg_id, item in raw.items():
            try:
                now_ms, task_id, due, code, attempt = unpackb(item, raw=True)
                due_ms, tries, at = int(due), int(attempt), int(now_ms)
                task, origin = task_id.decode(), origin_of(code.decode())
                partition: int | None = self.keys.partition_of(task)
            except (ValueError, TypeError, AttributeError, OverflowError):
                partition = None  # not written by reclaim.lua: only to drop
            ids, _, dead = out.setdefault(partition, ([], [], []))
            ids.append(msg_id)
            if partition is None:
                continue
            flat.setdefault(partition, []).extend([task_id, due, code, attempt])
            dead.append(
                OutcomeWrite(task, 2, at, POISON_LINE, due_ms, attempt=tries,
                             origin=origin, line=POISON_LINE)
            )  # fmt: skip
        for partition, values in flat.items():
            out[partition][1].extend(ended_flights(values, ENDED_DEAD, 4))
        return out

    async def poison_ends_ended(
        self, task_type: str, consumer: str, done: list[bytes], dead: list[OutcomeWrite]
    ) -> None:
        """Keep these poison ends (``poison_ends``: ids and their outcomes, in order) as
        having had their flights ended: their policy code cut to their origin, so that a
        round that writes them again records them without ending their flights twice."""
        values: list[Any] = []
        for msg_id, o in zip(done, dead, strict=True):
            letter = LETTER_OF_ORIGIN.get(o.origin)
            code = with_origin("", letter) if letter else ""
            values += [msg_id, packb([str(o.finished_ms), o.task_id, str(o.due_ms), code,
                                      str(o.attempt)])]  # fmt: skip
        if values:
            await self.client.execute("HSET", self.keys.poison_ends(task_type, consumer), *values)

    async def forget_poison_ends(self, task_type: str, consumer: str, done: list[bytes]) -> None:
        """Drop these poison ends (``poison_ends``), once they are done."""
        if done:
            await self.client.execute("HDEL", self.keys.poison_ends(task_type, consumer), *done)

    async def prune_consumers(self, task_type: str, min_idle_ms: int, keep: str) -> list[str]:
        """``prune_consumers.lua``: remove consumers idle that long with nothing pending
        and their names held by no live consumer (never ``keep``, the caller's consumer,
        which takes over the poison ends the removed ones' claimers left undone); their
        names."""
        k = self.keys
        keys = [k.queue(task_type), k.poison_ends(task_type, keep)]
        args = [GROUP, min_idle_ms, keep, k.poison_ends(task_type, ""), k.owner(task_type, "")]
        (removed,) = await self._run([(lua.PRUNE_CONSUMERS, keys, args)])
        return [r.decode() for r in removed]

    async def trim_acked(self, task_type: str, step: int = TRIM_STEP) -> int:
        """``trim_acked.lua``: drop the stream's acknowledged entries from its head, about
        ``step`` a call (whole nodes: a call may take a little less), calling again until
        one takes nothing or ``TRIM_CALLS`` have run; how many went."""
        total = 0
        for _ in range(TRIM_CALLS):
            (trimmed,) = await self._run(
                [(lua.TRIM_ACKED, [self.keys.queue(task_type)], [GROUP, step])]
            )
            if not int(trimmed):
                break
            total += int(trimmed)
        return total
