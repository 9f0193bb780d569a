"""The scheduling roles' scripts: the poller's claim, enqueue and commit (in one round
trip where it can), its partition leases and membership, and the retry dispatcher's claim
and commit. A part of ``actors.store.scripts.Scripts``; nothing else uses it alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from actors.store import lua
from actors.store.claim_replies import (
    add_read_definitions,
    decode_lean_claim,
    decode_partition_claim,
)
from actors.store.codes import (
    NOT_ENQUEUED,
    RETRY_CLAIM_HEADER,
    RETRY_CLAIM_ITEMS,
    flag,
    optional_ms,
)
from actors.store.definitions import DefinitionCache
from actors.store.flights import (
    FlightScripts,
)
from actors.store.known_states import KnownStates
from actors.store.records import pack_array
from actors.store.replies import (
    Commit,
    Fire,
    FireCommit,
    PartitionClaim,
    RetryClaim,
)
from actors.store.task_scripts import Call, or_empty, raise_first_error, set_apart
from runtime.config import check_name
from runtime.redis_replies import PartRejected

#: Most fires per enqueue script call: bounds how long one call holds Redis (~1-2 ms).
ENQUEUE_CHUNK = 500


#: How long a due task whose records cannot be read waits to be looked at again: short, so
#: that one mended by hand (no write counted) or by a newer version is soon fired.
UNREADABLE_AGAIN_MS = 5_000


class SchedulingScripts(FlightScripts):
    """The poller's and retry dispatcher's scripts, as typed async methods."""

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
        rejected: list[PartRejected] | None = None,
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
        (``KnownStates.committed``).

        This is the one place a claim updates the caches: the decoders
        (``actors.store.claim_replies``) read them and return what the claim taught (a
        partition held elsewhere, whether every due state was known, the definitions worth
        keeping), which is written to them here.

        ``rejected``: a partition whose claim or definitions read Redis rejects (its keys of
        another kind) goes there as ``PartRejected``, left out, the others claimed; without
        it the first error is raised."""
        k = self.keys
        gone = take_from or {}
        cache = definitions if definitions is not None and definitions.limit > 0 else None
        lean = flag(cache is not None)
        known = states if cache is not None else None
        calls: list[Call] = []
        for p in partitions:
            args = [k.tag(p), poller, token, limit, lease_ms, k.buckets, max(window_ms, lease_ms)]
            writes = known.writes_to_ask(p) if known is not None else None
            calls.append(
                (lua.CLAIM_DUE, [k.schedule(p), k.partition_owner(p)],
                 [*args, gone.get(p, ""), lean, or_empty(writes)])
            )  # fmt: skip
        replies = await self.client.mixed_scripts(calls) if calls else []
        partitions, replies = set_apart(partitions, replies, rejected)
        raise_first_error(replies)
        if cache is None:
            return [
                decode_partition_claim(p, r, k.buckets)
                for p, r in zip(partitions, replies, strict=True)
            ]
        leans = [
            decode_lean_claim(p, r, k.buckets, cache, known)
            for p, r in zip(partitions, replies, strict=True)
        ]
        for c in leans:  # what the claims tell the caches
            p = c.claim.partition
            if c.claim.held:
                cache.forget(p)
                if known is not None:
                    known.forget(p)
            elif known is not None:
                known.claimed(p, c.claim.writes)
                if c.complete is not None:
                    known.completed(p, c.complete)
        missing = [c for c in leans if c.misses]
        calls = [
            (lua.READ_DEFINITIONS,
             [k.schedule(c.claim.partition), k.partition_owner(c.claim.partition)],
             [k.tag(c.claim.partition), *[x for m in c.misses for x in m[:2]]])
            for c in missing
        ]  # fmt: skip
        reads = await self.client.mixed_scripts(calls) if calls else []
        read, reads = set_apart([c.claim.partition for c in missing], reads, rejected)
        raise_first_error(reads)
        read_claims = [c for c in missing if c.claim.partition in read]
        for c, reply in zip(read_claims, reads, strict=True):
            for task_id, version, definition in add_read_definitions(c, reply):
                cache.put(c.claim.partition, task_id, version, definition)
        kept = set(partitions) - {r.part for r in rejected or ()}
        return [c.claim for c in leans if c.claim.partition in kept]

    async def commit_fires(
        self,
        poller: str,
        token: str,
        commits: dict[int, list[FireCommit]],
        writes: Mapping[int, int],
        rejected: list[PartRejected] | None = None,
    ) -> dict[int, Commit]:
        """``commit_fires.lua`` per partition: advance each grid if ``token``'s claim is
        still in flight on a partition ``poller`` owns, and the task was not changed.
        ``writes``: each partition's count of API writes as the claim read it
        (``PartitionClaim.writes``). ``rejected``: a commit Redis rejects (its partition's
        keys of another kind) goes there as ``PartRejected``, the others' done (without it
        the first error is raised)."""
        calls = self._commit_calls(poller, token, commits, writes, [])
        replies = await self.client.mixed_scripts(calls) if calls else []
        parts, replies = set_apart(list(commits), replies, rejected)
        raise_first_error(replies)
        return self._decode_commits({p: commits[p] for p in parts}, replies)

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
            misfires = [c for c in items if c.misfire is not None]
            args.append(len(misfires))
            for c in misfires:
                fate, task_type, history = c.misfire  # type: ignore[misc]
                args += [c.task_id, fate, c.due_ms, task_type, history]
            rows: list[Any] = []
            for c in items:
                score = "" if c.score is None else str(c.score)
                if c.hold_ms:
                    score = f"{'*' if c.keep else '+'}{c.hold_ms}"
                elif c.parked:
                    score = f"^{score}"
                rows += [c.task_id, str(c.bucket), score, c.due_ms, c.state]
            args.append(pack_array(rows))
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
    ) -> tuple[list[bool], dict[int, Commit], list[PartRejected]]:
        """``enqueue`` then ``commit_fires``, in one round trip on a single server: each
        commit first checks that every enqueue call of the claim left its marker, so a
        failed enqueue leaves every grid where it was (a grid time moves only after its
        fires are in the stream) and the error is raised as ``enqueue`` would. A commit
        Redis rejects (its partition's keys) is returned apart, the others' done. Only where
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
        replies = await self.client.mixed_scripts(calls)
        raise_first_error(replies[: len(enqueues)])
        rejected: list[PartRejected] = []  # the others go on: their commits went through
        parts, ends = set_apart(list(commits), replies[len(enqueues) :], rejected)
        commits = {p: commits[p] for p in parts}
        raise_first_error(ends)
        flags = self._enqueue_flags(replies[: len(enqueues)], order, len(fires))
        done = self._decode_commits(commits, ends)
        # A commit can find a marker missing with every enqueue done only if it ran first:
        # the enqueue's script had to be loaded again and was sent once more (mixed_scripts).
        again = {
            p: commits[p] for p, r in zip(commits, ends, strict=True) if int(r[0]) == NOT_ENQUEUED
        }
        if again:
            gone = len(rejected)
            done |= await self.commit_fires(poller, token, again, writes, rejected)
            for r in rejected[gone:]:  # rejected now: reported apart, not done
                done.pop(r.part, None)
        return flags, done, rejected

    async def defer_unreadable(self, claims: Sequence[PartitionClaim]) -> None:
        """``defer_unreadable.lua`` for each claim that named due tasks whose records this
        version cannot read: they move ``UNREADABLE_AGAIN_MS`` on from the claim's time,
        unless an API write came to the partition since the claim. They stay due, looked
        at again then, and meanwhile hold no place in the claims."""
        k = self.keys
        calls: list[Call] = [
            (lua.DEFER_UNREADABLE, [k.schedule(c.partition), k.partition_owner(c.partition)],
             [c.writes, c.now_ms + UNREADABLE_AGAIN_MS, *(t for t, _ in c.unreadable)])
            for c in claims
            if c.unreadable
        ]  # fmt: skip
        if calls:
            await self._run(calls)

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
                    flag(self.keys.compact_messages),
                ]  # fmt: skip
                rows: list[Any] = []
                for i in chunk:
                    f = fires[i]
                    rows += [f.task_id, str(f.due_ms), f.payload, str(f.attempt), f.prior, f.policy]
                args.append(pack_array(rows))
                calls.append((lua.ENQUEUE, [self.keys.queue(task_type)], args))
                order += chunk
        return calls, order

    @staticmethod
    def _enqueue_flags(replies: list[Any], order: list[int], count: int) -> list[bool]:
        """Per fire (in the callers' order) whether it was appended."""
        flags = [bool(int(bit)) for reply in replies for bit in reply]
        appended = [False] * count
        for i, was_appended in zip(order, flags, strict=True):
            appended[i] = was_appended
        return appended

    # -- scheduling: retry dispatcher -------------------------------------------------------

    async def claim_retries(
        self, partitions: Sequence[int], token: str, limit: int, lease_ms: int,
        rejected: list[PartRejected] | None = None,
    ) -> list[RetryClaim]:  # fmt: skip
        """``claim_retries.lua`` per partition: reserve up to ``limit`` due retries each
        (dropping those of tasks deleted or stopped since). ``rejected``: a partition whose
        call Redis rejected (its keys of another kind, say) goes there as
        ``PartRejected``, left out, rather than failing the others' claims; without it the
        first error is raised, as is any error but a rejection (an outage, a refusal:
        every partition's)."""
        k = self.keys
        calls: list[Call] = [
            (
                lua.CLAIM_RETRIES,
                [k.retry(p)],
                [k.retry_context_prefix(p), token, limit, lease_ms, k.tag(p), k.buckets],
            )
            for p in partitions
        ]
        replies = await self.client.mixed_scripts(calls) if calls else []
        partitions, replies = set_apart(partitions, replies, rejected)
        raise_first_error(replies)
        claims = []
        for partition, reply in zip(partitions, replies, strict=True):
            flat = reply[RETRY_CLAIM_HEADER:]
            retries = []
            unreadable = [sid.decode(errors="replace") for sid in reply[3] or ()]
            for i in range(0, len(flat), RETRY_CLAIM_ITEMS):
                item = flat[i : i + RETRY_CLAIM_ITEMS]
                sid, task_id, task_type, payload, attempt, due, prior, policy = item
                try:  # text no version writes (another program's): named, left claimed
                    fire = Fire(
                        task_id.decode(), check_name("type", task_type.decode()), payload,
                        int(due), int(attempt), prior.decode(), policy.decode(),
                    )  # fmt: skip
                    retries.append((sid.decode(), fire))
                except ValueError:  # UnicodeDecodeError too
                    unreadable.append(sid.decode(errors="replace"))
            dropped = [sid.decode(errors="replace") for sid in reply[2] or ()]
            claim = RetryClaim(
                partition, int(reply[0]), optional_ms(reply[1]), retries, dropped, unreadable
            )
            claims.append(claim)
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
