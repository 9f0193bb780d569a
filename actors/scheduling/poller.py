"""The poller (the seed's "metronome"): moves due tasks into their type's stream.

Each partition is served by one poller at a time (``actors.scheduling.ownership``: leases
per partition, rebalanced as pollers come and go). One tick, for the partitions this poller
wants, in two round trips whatever the number of due tasks (each a pipeline of one script
call per partition or stream), and one more for each of these when a tick needs it: the
definitions its cache lacks, the overlap decisions of tasks with a policy, the runs a
``cancel_other`` fire cancels:

1. **claim** (``claim_due.lua``): take or renew the partition's lease for
   ``claim_lease_ms`` (or learn that another poller holds it) and read up to
   ``batch_size`` due tasks, on Redis's clock; nothing is written per task. Their
   definitions come from the poller's cache (by task version), and those it lacks in a
   second round trip (``actors.store.definitions``);
2. **enqueue**: XADD one message per fire to ``queue:{type}`` (the misfire policy decides
   how many fires a late task gets), and in the same pipeline
3. **commit** (``commit_fires.lua``): advance each task's grid only if every enqueue call
   of the claim left its marker (it completed), the partition is still this poller's and
   the task was not changed meanwhile. In a Redis Cluster, or with the dedupe window off
   (no markers), the commit waits for the enqueue's reply instead: a third round trip.

Invariant: a task's grid time moves only after its message is in the stream. A poller
killed between 1 and 3 leaves its tasks due; the next owner takes the partition when the
lease runs out and claims the same grid times, so the fire is late and maybe duplicated
(with the same schedule_id) but never lost. A partition has one owner at a time: a poller
stalled past its lease may still land its enqueue once Redis answers again (a fire twice,
at most), but its commit is refused. With the dedupe window on, a type whose stream Redis
rejects holds back its own tasks only, their grid where it was
(``actors.scheduling.tick_writes``). A partition whose keys Redis rejects (a key of another
kind in it) is left out of the tick, which goes on with the others, and tried again a
second later (``rejections.SetAside``); a rejected commit, whose fires were appended, is
sent again before the partition is claimed again.

Between ticks the poller sleeps until the earliest due time it saw, at most ``max_tick_s``;
a full batch means more is due, so it loops at once. Its work per tick is proportional to
what is due, never to the number of tasks.
"""

from __future__ import annotations

import attrs
import structlog
import trio

from actors.scheduling.claim_loop import (
    ClaimLoopSettings,
    CommittedClaims,
    RateMeter,
    TickResult,
    earliest,
    paced_pause_s,
    sleep_s,
)
from actors.scheduling.due_times import DueTimes
from actors.scheduling.ownership import LEAVE_S, Membership, hand_back
from actors.scheduling.policies import PolicyFires, apply_policies
from actors.scheduling.rejections import SET_ASIDE_S, Notices, SetAside, send_cancels
from actors.scheduling.tick_plan import TickPlan, hold_back, plan_claims, plan_commits
from actors.scheduling.tick_writes import Tick, TickWrites, enqueue_and_commit
from actors.store.definitions import DEFAULT_CACHED_DEFINITIONS, DefinitionCache
from actors.store.history import DEFAULT_HISTORY
from actors.store.keys import Keys
from actors.store.known_states import KnownStates
from actors.store.replies import Commit, Fire, FireCommit, PartitionClaim
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.liveness import holder_is_gone, owner_value
from runtime.logging import debug_enabled, emit_events
from runtime.redis_io import ResponseError
from runtime.redis_replies import PartRejected, rejected_alone


@attrs.frozen
class PollerSettings(ClaimLoopSettings):
    """The poller's settings: its batch, ticks and leases (``index`` and ``of`` are not
    used: which partitions it serves is decided by ownership)."""

    definition_cache: int = DEFAULT_CACHED_DEFINITIONS
    """Most task definitions kept between claims (``actors.store.definitions``; 0 = none)."""
    history: int = DEFAULT_HISTORY
    """Occurrences kept per task (``actors.store.history``)."""
    partitions: int | None = None
    """``[scheduler] partitions`` where the node sets it: a namespace that has another
    number keeps its own, and the poller says so at start."""


class Poller:
    def __init__(self, store: TaskStore, settings: PollerSettings) -> None:
        self.store = store
        self.settings = settings
        self.actor = f"node/scheduler/poller-{settings.index}"
        #: Names this poller in the partitions' owner hashes: host, pid and a token, so a
        #: poller of the same host can tell it is gone (``holder_is_gone``); the same across
        #: restarts of the actor, so a restarted poller keeps its partitions.
        self.poller_id = owner_value()
        self._token_base = self.poller_id.rsplit(":", 1)[1]
        self._ticks = 0
        self._rate = RateMeter()
        """Fires this poller enqueues a second (its shortest pause shrinks above a rate)."""
        self.membership: Membership | None = None
        self.owned: set[int] = set()
        """Partitions whose last claim was this poller's (not held by another)."""
        self._gone: dict[int, str] = {}
        """Partitions held by a poller found gone (a process of this host that exited)."""
        self._committed = CommittedClaims()
        """Claims committed in full whose enqueue markers go with the next enqueue."""
        self._definitions = DefinitionCache(settings.definition_cache)
        """The definitions of the tasks it claimed, so its claims read states alone."""
        self._states = KnownStates(settings.definition_cache)
        """The states it committed, so its claims need not read those either."""
        self._unreadable: set[str] = set()
        """Due tasks whose records could not be read (said once each; they stay due)."""
        self._notices = Notices(self.actor, "fires_held_back", "fires_resumed")
        """Says which types' streams Redis rejects (their tasks held back) and when not."""
        window_s = settings.dedupe_window_ms / 1000
        # tried again well within the window: its markers keep what a commit left appended
        self._aside = SetAside(
            self._notices, self._forget, min(SET_ASIDE_S, window_s / 4 or SET_ASIDE_S)
        )
        """The partitions whose calls Redis rejects, left out for a while."""
        self._due = DueTimes(settings.max_tick_s)
        """When each partition is next due: a round skips a partition with nothing due
        until ``max_tick_s`` has passed (tasks created meanwhile are noticed then)."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: tick until cancelled; then hand the partitions back. Started before it
        waits for Redis (the namespace's layout), so the node starts its other roles and
        its API meanwhile."""
        task_status.started()
        redis = self.store.client
        keys = await redis.ride_out(self.store.keys)
        scripts = await self.store.scripts()
        self.actor = self._notices.actor = ctx.path
        if self.membership is None:
            self.membership = Membership(
                self.poller_id, keys.partitions, self.settings.claim_lease_ms
            )
        ctx.log.info(
            "poller_ready", poller=self.poller_id, of=keys.partitions, buckets=keys.buckets
        )
        configured = self.settings.partitions
        if configured is not None and configured != keys.partitions:
            ctx.log.warning(
                "partitions_differ", configured=configured, stored=keys.partitions,
                error=f"[scheduler] partitions = {configured}, but namespace "
                f"{self.store.namespace!r} has {keys.partitions} (fixed when it was first "
                "used): it keeps them",
            )  # fmt: skip
        try:
            while True:
                # Redis away: wait and tick again; what was claimed and not committed is
                # claimed again (by this poller, or after the lease by another), so a
                # repeated tick loses nothing.
                result = await redis.ride_out(lambda: self.round(scripts, ctx.log), ctx.path)
                await trio.sleep(self.sleep_s(result))
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + LEAVE_S):
                await self.leave(scripts, ctx.log)

    async def round(
        self, scripts: Scripts, log: structlog.typing.FilteringBoundLogger
    ) -> TickResult:
        """Refresh the membership when due, tick the partitions wanted, and release the
        ones owned but no longer wanted (nothing of theirs is in flight between ticks, but
        a commit Redis rejected: sent once more first, else its next owner's claim finds
        its fires in the markers)."""
        membership = self.membership
        assert membership is not None
        if membership.due():
            members = await scripts.poller_members(self.poller_id, membership.ttl_ms)
            gone = [m for m in members if holder_is_gone(m, this_process_is_gone=False)]
            if gone:  # killed on this host (a restarted scheduler process's predecessor)
                members = await scripts.poller_members(self.poller_id, membership.ttl_ms, gone)
            if membership.update(members):
                log.info("partitions_wanted", partitions=membership.wanted, pollers=len(members))
        now = trio.current_time()
        due = [p for p in membership.wanted if self._due.may_be_due(p, now)]
        result = await self.tick(scripts, due, log) if due else TickResult(0, 0, None, False)
        result = self._due.with_earliest(result, membership.wanted)
        unwanted = sorted(self.owned - set(membership.wanted))
        if unwanted:
            await self._aside.commit_again(scripts, self.poller_id, unwanted, set(), log)
            try:
                released = await scripts.release_partitions(unwanted, self.poller_id)
                log.info("partitions_released", partitions=released)
            except ResponseError as exc:  # an owner hash rejected: its lease runs out instead
                if not rejected_alone(exc):
                    raise
                log.warning("partitions_not_released", partitions=unwanted, error=str(exc))
            self.owned -= set(unwanted)
            for p in unwanted:
                self._aside.drop(p)
                self._due.forget(p)
                self._definitions.forget(p)
                self._states.forget(p)
        return result

    async def leave(self, scripts: Scripts, log: structlog.typing.FilteringBoundLogger) -> None:
        """Hand every partition back (``ownership.hand_back``), a commit Redis rejected sent
        once more first (still rejected, the next owner's claim finds its fires in the
        markers)."""
        owned = sorted(self.owned)
        if self._aside.unsent:
            try:  # best effort, as the hand-back is (a bug here must not skip it)
                with trio.move_on_after(LEAVE_S / 4):
                    await self._aside.commit_again(scripts, self.poller_id, owned, set(), log)
            except Exception as exc:
                log.warning("commit_not_sent", error=str(exc))
        if await hand_back(scripts, self.poller_id, self.owned, log):
            for p in owned:
                self._aside.drop(p)
                self._forget(p)
            self.owned.clear()

    def partitions(self, keys: Keys) -> list[int]:
        """The partitions this poller wants now (all of them before it knows of others)."""
        return self.membership.wanted if self.membership else list(range(keys.partitions))

    def sleep_s(self, result: TickResult) -> float:
        """The pause after a round: see ``claim_loop.sleep_s``, with the shortest pause
        following the namespace's rate within the lag budget (``claim_loop.paced_pause_s``)."""
        self._rate.add(result.enqueued, trio.current_time())
        shortest = paced_pause_s(
            self.settings.min_tick_s, self.settings.max_batch_delay_s, self.namespace_rate()
        )
        return sleep_s(result, self.settings.max_tick_s, shortest)

    def namespace_rate(self) -> float:
        """Fires a second of the whole namespace as this poller can tell: its own, scaled by
        the share of the partitions it wants (tasks spread evenly over them). So every
        poller pauses as one poller serving them all would: each partition's claims gather
        as many fires, and the CPU a fire stays flat as pollers are added (with its own
        rate, two pollers at 10,000 fires/s paused half as long: Redis 22.2 against ~19 µs
        a fire, docs/PERFORMANCE.md)."""
        membership = self.membership
        if membership is None or not membership.wanted:
            return self._rate.rate
        return self._rate.rate * membership.partitions / len(membership.wanted)

    async def tick(
        self, scripts: Scripts, partitions: list[int], log: structlog.typing.FilteringBoundLogger
    ) -> TickResult:
        """``_tick`` over ``partitions``, but those set aside (``SetAside.run``)."""
        return await self._aside.run(
            lambda left, aside: self._tick(scripts, left, log, aside), partitions
        )

    def _forget(self, partition: int) -> None:
        """What is known of ``partition``, dropped (set aside: read afresh when tried again)."""
        self._definitions.forget(partition)
        self._states.forget(partition)
        self._due.forget(partition)

    async def _tick(
        self,
        scripts: Scripts,
        partitions: list[int],
        log: structlog.typing.FilteringBoundLogger,
        aside: set[int],
    ) -> TickResult:
        """Claim, enqueue and commit everything due now in ``partitions``; ``aside``
        gathers those set aside.

        From the claim on, the claims are this poller's: if Redis goes away, each step
        waits for it and goes on with the same token rather than leave its claims to
        expire (a lease later). An enqueue repeated after a lost reply finds its own
        markers and answers as before; a commit checks the claim still holds (and, sent
        with the enqueue, that the enqueue left its markers: nothing is committed if the
        enqueue failed, and the claims expire and the fires come back)."""
        self._ticks += 1
        token = f"{self._token_base}-{self._ticks}"
        if self._aside.unsent:  # commits Redis rejected: sent again before a new claim
            partitions = await self._aside.commit_again(
                scripts, self.poller_id, partitions, aside, log
            )
        claims = await self._claim(scripts, partitions, token, log, aside)
        plan = plan_claims(claims, debug_enabled())
        writes = {c.partition: c.writes for c in claims}
        decided = await self._apply_policies(scripts, token, plan, writes)
        if decided.rejected:  # left out: its tasks planned again when claimed again
            for rejected in decided.rejected:
                self._aside.add(rejected, aside)
            claims = [c for c in claims if c.partition not in aside]
            plan = plan_claims(claims, debug_enabled())
        # One info line per fire is written when it ends (the consumer's, with every
        # lifecycle time); the claim's own line is a debug line.
        if plan.scheduled:
            emit_events(self.actor, plan.scheduled, level="debug")
        commits = plan_commits(
            plan.plans, decided.commits, decided.tracked, self.settings.history, decided.parked
        )
        if decided.waits:  # another decider's fire in flight: decided when claimed again
            commits = hold_back(commits, plan.plans, decided.waits)
        w = await self._enqueue_and_commit(scripts, token, plan, decided.fires, commits, writes)
        for rejected in w.aside:  # its commit sent again before its next claim
            self._aside.add(rejected, aside)
            self._aside.unsent[rejected.part] = (token, w.unsent[rejected.part], writes)
        claims = [c for c in claims if c.partition not in aside]
        # A task held back is planned again when claimed again: said then, not twice.
        again = w.held | decided.waits.keys()
        said = [
            line for line in [*plan.misfired, *decided.not_run] if line[1]["task_id"] not in again
        ]
        if said:
            emit_events(self.actor, said)
        return self._after_commit(
            token, plan.now_ms, claims, w.commits, writes, w.done, w.appended, w.kept, log
        )

    async def _claim(
        self,
        scripts: Scripts,
        partitions: list[int],
        token: str,
        log: structlog.typing.FilteringBoundLogger,
        aside: set[int],
    ) -> list[PartitionClaim]:
        """Claim the due tasks of ``partitions`` (``claim_due.lua``) and learn from the
        answer which partitions are this poller's: the claims of the others, held by
        another poller, are dropped (one held by a poller found gone is taken next tick).
        A partition whose claim Redis rejects is set aside (into ``aside``)."""
        s = self.settings
        rejected: list[PartRejected] = []
        claims = await scripts.claim_due(
            partitions, self.poller_id, token, s.batch_size, s.claim_lease_ms,
            s.dedupe_window_ms, self._gone, self._definitions, self._states, rejected,
        )  # fmt: skip
        for r in rejected:
            self._aside.add(r, aside)
        self._gone = {}
        for c in claims:
            if c.held:
                self.owned.discard(c.partition)
                if holder_is_gone(c.holder, this_process_is_gone=False):
                    # a process of this host that exited: take its partition next tick
                    self._gone[c.partition] = c.holder
            else:
                self.owned.add(c.partition)
        claims = [c for c in claims if not c.held]
        self._report_unreadable(claims, log)
        await scripts.defer_unreadable(claims)
        for p in partitions:
            self._due.forget(p)
        return claims

    def _report_unreadable(
        self, claims: list[PartitionClaim], log: structlog.typing.FilteringBoundLogger
    ) -> None:
        """One ``task_unreadable`` line per due task whose records this version cannot
        read: once each, not every tick (they stay due until a version reads them, looked
        at again a few seconds on: ``defer_unreadable``)."""
        for c in claims:
            for task_id, problem in c.unreadable:
                if task_id not in self._unreadable:
                    if len(self._unreadable) >= 10_000:
                        self._unreadable.clear()
                    self._unreadable.add(task_id)
                    log.error("task_unreadable", task_id=task_id, error=problem)

    async def _apply_policies(
        self, scripts: Scripts, token: str, plan: TickPlan, writes: dict[int, int]
    ) -> PolicyFires:
        """The planned fires through the tasks' catch-up windows and overlap policies
        (``actors.scheduling.policies``): the running fires a ``cancel_other`` fire
        replaces are cancelled; each fire not run is a ``not_run`` line, written by the tick
        after its writes (none for a task held back: it is decided again)."""
        redis = scripts.client
        decided = await redis.ride_out(
            lambda: apply_policies(
                scripts,
                token,
                plan.now_ms,
                plan.planned,
                self.settings.history,
                self.settings.claim_lease_ms,
                writes,
            )
        )
        if decided.cancels:
            await send_cancels(redis, scripts.cancel_fires, decided.cancels, self.actor)
        return decided

    async def _enqueue_and_commit(
        self,
        scripts: Scripts,
        token: str,
        plan: TickPlan,
        fires: list[Fire],
        commits: dict[int, list[FireCommit]],
        writes: dict[int, int],
    ) -> TickWrites:
        """The tick's writes (``tick_writes.enqueue_and_commit``), with the markers of the
        claims committed in full before (``CommittedClaims``)."""
        committed = self._committed.take({f.type for f in fires})
        s = self.settings
        return await enqueue_and_commit(
            scripts, self.actor, self.poller_id, s.dedupe_window_ms, s.claim_lease_ms,
            self._notices, Tick(token, plan, fires, commits, writes, committed),
        )  # fmt: skip

    def _after_commit(
        self,
        token: str,
        now: int,
        claims: list[PartitionClaim],
        commits: dict[int, list[FireCommit]],
        writes: dict[int, int],
        done: dict[int, Commit],
        fires: list[Fire],
        kept: bool,
        log: structlog.typing.FilteringBoundLogger,
    ) -> TickResult:
        """Remember what the tick committed: the states it wrote (the next claims need
        not read them), its token's markers when committed in full (they go with the next
        enqueue of those types), and each partition's earliest due time (the committed
        one, else the claim's), which decides when the partition is claimed again."""
        earliest_by_partition = {c.partition: c.earliest_ms for c in claims}
        for p, commit in done.items():
            for lost in commit.lost:
                log.warning("claim_lost", task_id=lost)
            self._remember(p, writes[p], commits[p], commit)
        earliest_by_partition |= {p: commit.earliest_ms for p, commit in done.items()}
        types = {f.type for f in fires}
        # a claim kept in flight (tasks held back) is not committed in full
        in_full = not kept and not any(commit.lost for commit in done.values())
        if done and in_full and types and self.settings.dedupe_window_ms > 0:
            self._committed.add(token, types)
        at = trio.current_time()
        for c in claims:
            self._due.seen(c.partition, earliest_by_partition[c.partition], c.now_ms, at)
        return TickResult(
            enqueued=len(fires),
            now_ms=now,
            earliest_ms=earliest(list(earliest_by_partition.values())),
            full=any(len(c.tasks) >= self.settings.batch_size for c in claims),
        )

    def _remember(
        self, partition: int, writes: int, commits: list[FireCommit], commit: Commit
    ) -> None:
        """Keep the states a commit wrote, so the next claims need not read them; after a
        commit that lost tasks, know none of the partition's (another poller, or an API
        write, may have written them)."""
        if commit.lost:
            self._states.forget(partition)
        else:
            self._states.committed(partition, writes, commits)
