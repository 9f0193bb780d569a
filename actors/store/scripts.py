"""The typed door to the Lua scripts: one method per script, keys built inside.

Each script's header (in ``lua/<name>.lua``) lists its KEYS, ARGV and reply; the methods
here are the only code that builds those lists or decodes those replies. Callers pass
typed values (partitions, task ids, messages) and get typed results (``actors.store.replies``)
or typed errors (``actors.store.codes``). Calls that cover several partitions or types are
pipelined in one round trip, one script call per partition or per chunk.

The roles depend on ``Scripts`` alone, so a test can subclass it to fail at a chosen step
(``tests/test_poller.py`` fails a commit and checks that the fire still runs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from actors.store import lua
from actors.store.codes import optional_ms
from actors.store.definitions import DefinitionCache
from actors.store.flights import (
    ENDED_DEAD,
    ENDED_DROPPED,
    FlightEnd,
    FlightScripts,
    ended_flights,
    paused_of,
)
from actors.store.keys import GROUP
from actors.store.known_states import KnownStates
from actors.store.messages import Message, flat_fields
from actors.store.replies import (
    Commit,
    DeadLetterWrite,
    Fire,
    FireCommit,
    OutcomeWrite,
    PartitionClaim,
    Reclaim,
    Reclaimed,
    RetryClaim,
    RetryWrite,
    add_read_definitions,
    decode_lean_claim,
    decode_partition_claim,
)
from actors.store.task_scripts import Call, or_empty, raise_first_error

#: Most fires per enqueue script call: bounds how long one call holds Redis (~1-2 ms).
ENQUEUE_CHUNK = 500

#: ``commit_fires.lua``'s answer when an enqueue marker it checks is missing: nothing changed.
NOT_ENQUEUED = -2

#: Most stream entries one ``trim_acked.lua`` call drops (whole listpack nodes of ~100: a
#: call frees ~1,000 nodes, well under a millisecond); ``trim_acked`` repeats it while
#: it takes some, so a stream is trimmed to its acknowledged head at any rate.
TRIM_STEP = 100_000
#: Most such calls one ``trim_acked`` makes (the rest waits for the claimer's next round).
TRIM_CALLS = 20


class Scripts(FlightScripts):
    """Every Lua script of one namespace, as typed async methods (the task store's own
    scripts are in the base class)."""

    # -- scheduling: poller -----------------------------------------------------------------

    async def claim_due(
        self,
        partitions: Sequence[int],
        poller: str,
        token: str,
        limit: int,
        lease_ms: int,
        window_ms: int = 60_000,
        take_from: Mapping[int, str] | None = None,
        definitions: DefinitionCache | None = None,
        states: KnownStates | None = None,
    ) -> list[PartitionClaim]:
        """``claim_due.lua`` per partition: take or keep the partition for ``poller`` for
        ``lease_ms`` and read up to ``limit`` due tasks (none where another poller holds
        it: ``PartitionClaim.held``). ``token`` names this claim (unique per claim);
        uncommitted claims are remembered as priors for ``window_ms``. ``take_from``:
        partition -> a holder found gone, whose lease need not be waited for.

        ``definitions``: the caller's cache (``actors.store.definitions``). The claim then
        reads the tasks' states alone, and the definitions the cache lacks in a second
        round trip (only for the partitions that lack some); a partition found held by
        another poller is forgotten there.

        ``states`` (with ``definitions``): the states the caller committed
        (``actors.store.known_states``); a partition's claim then leaves the states out
        while they are the stored ones, and the caller tells what it commits
        (``KnownStates.committed``)."""
        k = self.keys
        gone = take_from or {}
        cache = definitions if definitions is not None and definitions.limit > 0 else None
        lean = "" if cache is None else "1"
        known = states if cache is not None else None
        calls: list[Call] = []
        for p in partitions:
            args = [k.tag(p), poller, token, limit, lease_ms, k.buckets, max(window_ms, lease_ms)]
            writes = known.writes_to_ask(p) if known is not None else None
            calls.append(
                (lua.CLAIM_DUE, [k.schedule(p), k.partition_owner(p)],
                 [*args, gone.get(p, ""), lean, or_empty(writes)])
            )  # fmt: skip
        replies = await self._run(calls)
        if cache is None:
            return [
                decode_partition_claim(p, r, k.buckets)
                for p, r in zip(partitions, replies, strict=True)
            ]
        leans = [
            decode_lean_claim(p, r, k.buckets, cache, known)
            for p, r in zip(partitions, replies, strict=True)
        ]
        for c in leans:
            if c.claim.held:
                cache.forget(c.claim.partition)
                if known is not None:
                    known.forget(c.claim.partition)
        missing = [c for c in leans if c.misses]
        reads = await self._run(
            [
                (lua.READ_DEFINITIONS,
                 [k.schedule(c.claim.partition), k.partition_owner(c.claim.partition)],
                 [k.tag(c.claim.partition), *[x for m in c.misses for x in m[:2]]])
                for c in missing
            ]
        )  # fmt: skip
        for c, reply in zip(missing, reads, strict=True):
            add_read_definitions(c, reply, cache)
        return [c.claim for c in leans]

    async def commit_fires(
        self,
        poller: str,
        token: str,
        commits: dict[int, list[FireCommit]],
        writes: Mapping[int, int],
    ) -> dict[int, Commit]:
        """``commit_fires.lua`` per partition: advance each grid if ``token``'s claim is
        still in flight on a partition ``poller`` owns, and the task was not changed.
        ``writes``: each partition's count of API writes as the claim read it
        (``PartitionClaim.writes``)."""
        replies = await self._run(self._commit_calls(poller, token, commits, writes, []))
        return self._decode_commits(commits, replies)

    def _commit_calls(
        self,
        poller: str,
        token: str,
        commits: dict[int, list[FireCommit]],
        writes: Mapping[int, int],
        markers: Sequence[tuple[str, int]],
    ) -> list[Call]:
        """One ``commit_fires.lua`` call per partition, each checking that ``markers``
        (enqueue marker key, part) are there first."""
        calls: list[Call] = []
        k = self.keys
        checks = [part for _, part in markers]
        marker_keys = [key for key, _ in markers]
        for partition, items in commits.items():
            args: list[Any] = [k.tag(partition), poller, token, writes[partition]]
            confirms = [c.task_id for c in items if c.confirm]
            args += [len(checks), *checks, len(confirms), *confirms]
            for c in items:
                args += [c.task_id, c.bucket, or_empty(c.score), c.due_ms, c.state]
            keys = [k.schedule(partition), k.partition_owner(partition), *marker_keys]
            calls.append((lua.COMMIT_FIRES, keys, args))
        return calls

    @staticmethod
    def _decode_commits(
        commits: dict[int, list[FireCommit]], replies: list[Any]
    ) -> dict[int, Commit]:
        return {
            p: Commit(optional_ms(r[0]), [x.decode() for x in r[1:]])
            for p, r in zip(commits, replies, strict=True)
        }

    def commits_with_enqueue(self, dedupe_window_ms: int) -> bool:
        """Whether ``enqueue_and_commit`` sends the commits in the enqueue's round trip: on
        a single server, with markers to check (a dedupe window)."""
        return not self.client.is_cluster and dedupe_window_ms > 0

    async def enqueue_and_commit(
        self,
        fires: Sequence[Fire],
        now_ms: int,
        dedupe_window_ms: int,
        token: str,
        committed: Mapping[str, Sequence[str]] | None,
        poller: str,
        commits: dict[int, list[FireCommit]],
        writes: Mapping[int, int],
    ) -> tuple[list[bool], dict[int, Commit]]:
        """``enqueue`` then ``commit_fires``, in one round trip on a single server: each
        commit first checks that every enqueue call of the claim left its marker, so a
        failed enqueue leaves every grid where it was (a grid time moves only after its
        fires are in the stream) and the error is raised as ``enqueue`` would. Only where
        ``commits_with_enqueue``: in a cluster (the streams and the partitions are on
        different shards, which run a pipeline in no set order) or without markers
        (``dedupe_window_ms`` 0) the caller makes two round trips, ridden out one by one."""
        if not (fires and self.commits_with_enqueue(dedupe_window_ms)):
            raise ValueError("enqueue_and_commit needs fires, one server and a dedupe window")
        enqueues, order = self._enqueue_calls(fires, now_ms, dedupe_window_ms, token, committed)
        # enqueue.lua's marker of each call: <prefix><token>, field = the call's part
        markers = [(f"{args[2]}{token}", args[5]) for _, _, args in enqueues]
        calls = enqueues + self._commit_calls(poller, token, commits, writes, markers)
        # an enqueue's error is raised first (the commits behind it refused)
        replies = await self._run(calls)
        flags = self._enqueue_flags(replies[: len(enqueues)], order, len(fires))
        done = self._decode_commits(commits, replies[len(enqueues) :])
        # A commit can find a marker missing with every enqueue done only if it ran first:
        # the enqueue's script had to be loaded again and was sent once more (mixed_scripts).
        again = {
            p: commits[p]
            for p, r in zip(commits, replies[len(enqueues) :], strict=True)
            if int(r[0]) == NOT_ENQUEUED
        }
        if again:
            done |= await self.commit_fires(poller, token, again, writes)
        return flags, done

    async def release_partitions(self, partitions: Sequence[int], poller: str) -> list[int]:
        """``release_partition.lua`` per partition: the ones ``poller`` let go of."""
        k = self.keys
        replies = await self._run(
            [(lua.RELEASE_PARTITION, [k.partition_owner(p)], [poller]) for p in partitions]
        )
        return [p for p, released in zip(partitions, replies, strict=True) if int(released)]

    async def poller_members(self, poller: str, ttl_ms: int, gone: Sequence[str] = ()) -> list[str]:
        """``poller_members.lua``: say ``poller`` is alive for ``ttl_ms`` (0: it leaves),
        remove the pollers in ``gone``; the live pollers, sorted."""
        args = [poller, ttl_ms, *gone]
        (live,) = await self._run([(lua.POLLER_MEMBERS, [self.keys.pollers], args)])
        return [m.decode() for m in live]

    async def enqueue(
        self,
        fires: Sequence[Fire],
        now_ms: int,
        dedupe_window_ms: int,
        token: str = "",
        committed: Mapping[str, Sequence[str]] | None = None,
    ) -> list[bool]:
        """``enqueue.lua``: append fires to their types' streams, one call per type per
        ``ENQUEUE_CHUNK``; per fire (in the given order) True if appended, False if the
        claim it came from (``Fire.prior``) had appended it already. ``token`` names this
        claim in the markers (unique per claim: ``dedupe_window_ms`` > 0 needs one).
        ``committed``: type -> tokens of the caller's earlier claims, committed in full
        (no claim can name them as prior): their markers in that type's stream go, in the
        type's first call."""
        calls, order = self._enqueue_calls(fires, now_ms, dedupe_window_ms, token, committed)
        return self._enqueue_flags(await self._run(calls), order, len(fires))

    def _enqueue_calls(
        self,
        fires: Sequence[Fire],
        now_ms: int,
        dedupe_window_ms: int,
        token: str,
        committed: Mapping[str, Sequence[str]] | None,
    ) -> tuple[list[Call], list[int]]:
        """``enqueue``'s calls, and the index in ``fires`` of each fire they carry, in order."""
        dropped = committed or {}
        if dedupe_window_ms > 0 and not token:
            raise ValueError("enqueue with a dedupe window needs the claim's token")
        by_type: dict[str, list[int]] = defaultdict(list)
        for i, fire in enumerate(fires):
            by_type[fire.type].append(i)
        calls: list[Call] = []
        order: list[int] = []
        for task_type, indexes in by_type.items():
            for start in range(0, len(indexes), ENQUEUE_CHUNK):
                chunk = indexes[start : start + ENQUEUE_CHUNK]
                args: list[Any] = [
                    now_ms, task_type, self.keys.enqueued_prefix(task_type), dedupe_window_ms,
                    token, start, "" if start else " ".join(dropped.get(task_type, ())),
                    "1" if self.keys.compact_messages else "",
                ]  # fmt: skip
                for i in chunk:
                    f = fires[i]
                    args += [f.task_id, f.due_ms, f.payload, f.attempt, f.prior, f.policy]
                calls.append((lua.ENQUEUE, [self.keys.queue(task_type)], args))
                order += chunk
        return calls, order

    @staticmethod
    def _enqueue_flags(replies: list[Any], order: list[int], count: int) -> list[bool]:
        """Per fire (in the callers' order) whether it was appended."""
        flags = [bool(int(flag)) for reply in replies for flag in reply]
        appended = [False] * count
        for i, flag in zip(order, flags, strict=True):
            appended[i] = flag
        return appended

    # -- scheduling: retry dispatcher -------------------------------------------------------

    async def claim_retries(
        self, partitions: Sequence[int], token: str, limit: int, lease_ms: int
    ) -> list[RetryClaim]:
        """``claim_retries.lua`` per partition: reserve up to ``limit`` due retries each."""
        k = self.keys
        replies = await self._run(
            [
                (
                    lua.CLAIM_RETRIES,
                    [k.retry(p)],
                    [k.retry_context_prefix(p), token, limit, lease_ms],
                )
                for p in partitions
            ]
        )
        claims = []
        for partition, reply in zip(partitions, replies, strict=True):
            flat = reply[2:]
            retries = []
            for i in range(0, len(flat), 8):
                sid, task_id, task_type, payload, attempt, due, prior, policy = flat[i : i + 8]
                fire = Fire(
                    task_id.decode(), task_type.decode(), payload, int(due), int(attempt),
                    prior.decode(), policy.decode(),
                )  # fmt: skip
                retries.append((sid.decode(), fire))
            claims.append(RetryClaim(partition, int(reply[0]), optional_ms(reply[1]), retries))
        return claims

    async def commit_retries(self, token: str, claimed: dict[int, list[str]]) -> dict[int, Commit]:
        """``commit_retries.lua`` per partition: delete the retry contexts whose claim by
        ``token`` still holds; ``Commit.lost`` names the schedule ids it did not hold."""
        k = self.keys
        replies = await self._run(
            [
                (lua.COMMIT_RETRIES, [k.retry(p)], [k.retry_context_prefix(p), token, *sids])
                for p, sids in claimed.items()
            ]
        )
        return {
            p: Commit(optional_ms(r[0]), [x.decode() for x in r[1:]])
            for p, r in zip(claimed, replies, strict=True)
        }

    # -- execution: consumer ----------------------------------------------------------------

    async def begin_runs(
        self, task_type: str, messages: Sequence[Message], window_ms: int
    ) -> list[bool]:
        """``begin_runs.lua``: per message, True to run it, False for a duplicate fire."""
        args: list[Any] = [self.keys.seen_prefix(task_type), window_ms]
        for m in messages:
            args += [m.msg_id, m.fire_key]
        (flags,) = await self._run([(lua.BEGIN_RUNS, [self.keys.queue(task_type)], args)])
        return [bool(int(flag)) for flag in flags]

    def _ack_call(self, task_type: str, ids: Sequence[str]) -> Call:
        return (lua.ACK, [self.keys.queue(task_type)], [GROUP, *ids])

    def _dead_letter_call(self, task_type: str, entries: Sequence[DeadLetterWrite]) -> Call:
        args: list[Any] = [GROUP]
        for entry in entries:
            flat = [x for kv in entry.fields.items() for x in kv]
            args += [entry.msg_id, len(flat), *flat]
        return (lua.DEAD_LETTER, [self.keys.queue(task_type), self.keys.dlq(task_type)], args)

    async def ack(self, task_type: str, ids: Sequence[str]) -> int:
        """``ack.lua``: acknowledge finished messages; how many were pending (the entries
        are trimmed later, ``trim_acked``)."""
        if not ids:
            return 0
        (count,) = await self._run([self._ack_call(task_type, ids)])
        return int(count)

    async def dead_letter(self, task_type: str, entries: Sequence[DeadLetterWrite]) -> list[str]:
        """``dead_letter.lua``: move messages to the DLQ with their ACK; the DLQ entry ids
        ('' for a message no longer pending: it gets no second dead letter)."""
        if not entries:
            return []
        (ids,) = await self._run([self._dead_letter_call(task_type, entries)])
        return [i.decode() for i in ids]

    def _retry_call(self, partition: int, retries: Sequence[RetryWrite]) -> Call:
        k = self.keys
        args: list[Any] = [k.retry_context_prefix(partition)]
        for r in retries:
            m = r.message
            args += [
                m.schedule_id, r.delay_ms, m.task_id, m.type, m.payload_json,
                m.attempt + 1, m.due_ms, r.error, m.policy,
            ]  # fmt: skip
        return (lua.SCHEDULE_RETRIES, [k.retry(partition)], args)

    def _outcomes_call(self, partition: int, outcomes: Sequence[OutcomeWrite]) -> Call:
        k = self.keys
        args: list[Any] = [k.tag(partition)]
        for o in outcomes:
            args += [o.task_id, k.bucket_of(o.task_id), o.outcome, o.finished_ms, o.error]
        return (lua.RECORD_OUTCOMES, [k.schedule(partition)], args)

    async def schedule_retries(self, retries: Sequence[RetryWrite]) -> None:
        """``schedule_retries.lua`` per partition: save retry contexts, scored by retry time."""
        await self._run(self._partition_calls(retries, []))

    async def record_outcomes(self, outcomes: Sequence[OutcomeWrite]) -> int:
        """``record_outcomes.lua`` per partition: each task's last run; how many updated."""
        return sum(int(r) for r in await self._run(self._partition_calls([], outcomes)))

    def _partition_calls(
        self, retries: Sequence[RetryWrite], outcomes: Sequence[OutcomeWrite]
    ) -> list[Call]:
        retry_by: dict[int, list[RetryWrite]] = defaultdict(list)
        for r in retries:
            retry_by[self.keys.partition_of(r.message.task_id)].append(r)
        outcome_by: dict[int, list[OutcomeWrite]] = defaultdict(list)
        for o in outcomes:
            outcome_by[self.keys.partition_of(o.task_id)].append(o)
        return [self._retry_call(p, rs) for p, rs in retry_by.items()] + [
            self._outcomes_call(p, os) for p, os in outcome_by.items()
        ]

    async def complete(
        self,
        task_type: str,
        *,
        retries: Sequence[RetryWrite],
        outcomes: Sequence[OutcomeWrite],
        dead: Sequence[DeadLetterWrite],
        acks: Sequence[str],
        written: set[int] | None = None,
        flights: Sequence[FlightEnd] = (),
        paused: list[tuple[str, int]] | None = None,
    ) -> None:
        """A consumer's batch of outcomes, in the order that keeps the ACK invariant:
        retry contexts and task outcomes first, then dead letters and ACKs, only once every
        one of those writes succeeded. Two round trips (in one hop to the I/O thread), on
        one server too: a pipeline runs every command, so an ACK pipelined behind a refused
        write (``OOM``, ``MISCONF``, a key of the wrong type) would be acknowledged with its
        retry never written. A write that fails raises here with nothing acknowledged.

        ``written``: the partition writes of this batch that went through on an earlier
        attempt (by index; this call adds to it), so that an attempt repeated after a
        refusal sends only the rest: a retry context written again after the dispatcher
        took it would run that attempt twice. (After a lost connection nothing is known
        and every write is sent again.) Dead letters are safe to repeat: one is written
        only while its message is pending.

        ``flights``: fires of tasks with a policy that ended (``end_flights.lua``, with the
        partition writes); ``paused`` gets the tasks that paused for their failures."""
        done = written if written is not None else set()
        partition_calls = self._partition_calls(retries, outcomes)
        flight_calls = len(partition_calls)
        partition_calls += self.end_flight_calls(flights)
        todo = [i for i in range(len(partition_calls)) if i not in done]
        stream_calls = ([self._dead_letter_call(task_type, dead)] if dead else []) + (
            [self._ack_call(task_type, acks)] if acks else []
        )
        first, then = await self.client.scripts_in_order(
            [partition_calls[i] for i in todo], stream_calls
        )
        done.update(
            i for i, reply in zip(todo, first, strict=True) if not isinstance(reply, Exception)
        )
        if paused is not None and flights:
            paused += paused_of(
                [r for i, r in zip(todo, first, strict=True)
                 if i >= flight_calls and not isinstance(r, Exception)]
            )  # fmt: skip
        raise_first_error([*first, *(then or ())])

    async def renew_leases(self, task_type: str, consumer: str, ids: Sequence[str]) -> list[str]:
        """``renew_leases.lua``: reset the idle time of our own in-flight messages."""
        if not ids:
            return []
        (renewed,) = await self._run(
            [(lua.RENEW_LEASES, [self.keys.queue(task_type)], [GROUP, consumer, *ids])]
        )
        return [i.decode() for i in renewed]

    async def release(self, task_type: str, consumer: str, idle_ms: int) -> tuple[list[str], bool]:
        """``release.lua``: hand back everything pending under ``consumer`` with ``idle_ms``;
        (released ids, whether the consumer left the group)."""
        ((released, removed),) = await self._run(
            [(lua.RELEASE, [self.keys.queue(task_type)], [GROUP, consumer, idle_ms])]
        )
        return [i.decode() for i in released], bool(int(removed))

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

    async def recover(
        self, task_type: str, consumer: str, count: int, min_idle_ms: int = 0
    ) -> list[Reclaimed]:
        """``recover.lua``: claim back what is pending under ``consumer`` with at least
        ``min_idle_ms`` of idle time (idle reset, delivery count kept), as (id, fields)."""
        (entries,) = await self._run(
            [(lua.RECOVER, [self.keys.queue(task_type)], [GROUP, consumer, count, min_idle_ms])]
        )
        return [
            Reclaimed(msg_id.decode(), consumer, 0, 0, flat_fields(fields))
            for msg_id, fields in entries
        ]

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
        ((claimed, poisoned, stalled, now_ms, ended),) = await self._run(
            [(lua.RECLAIM, [k.queue(task_type), k.dlq(task_type)], args)]
        )
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
            ended=ended_flights(ended, ENDED_DEAD),
        )

    async def prune_consumers(self, task_type: str, min_idle_ms: int, keep: str) -> list[str]:
        """``prune_consumers.lua``: remove consumers idle that long with nothing pending
        (never ``keep``); their names."""
        (removed,) = await self._run(
            [(lua.PRUNE_CONSUMERS, [self.keys.queue(task_type)], [GROUP, min_idle_ms, keep])]
        )
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

    # -- operators --------------------------------------------------------------------------

    async def purge_queue(
        self, task_type: str, upto: str, count: int
    ) -> tuple[int, list[FlightEnd]]:
        """``purge_queue.lua``: delete up to ``count`` undelivered messages with ids up to
        ``upto``; how many it deleted, and the flights of tasks with a policy they end."""
        ((deleted, ended),) = await self._run(
            [(lua.PURGE_QUEUE, [self.keys.queue(task_type)], [GROUP, upto, count])]
        )
        return int(deleted), ended_flights(ended, ENDED_DROPPED)

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
        now_ms: int, retention_ms: int, policy: str = "",
    ) -> list[bool]:  # fmt: skip
        """``backfill.lua``: append a task's grid times not backfilled before (one call;
        the caller keeps it to ``ENQUEUE_CHUNK`` times); per time, True if appended.
        ``policy``: the messages' policy code ('' = none)."""
        k = self.keys
        args = [now_ms, task_type, task_id, payload, retention_ms,
                "1" if k.compact_messages else "", policy, *due_times]  # fmt: skip
        (flags,) = await self._run(
            [(lua.BACKFILL, [k.queue(task_type), k.backfilled(task_type, task_id)], args)]
        )
        return [bool(int(flag)) for flag in flags]


def as_str(value: bytes | str | int) -> str:
    """A script reply element as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
