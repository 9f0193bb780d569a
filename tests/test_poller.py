"""The poller against a real Redis: each due time reaches its stream once, claims hold,
competing pollers do not duplicate, and SIGKILL mid-batch loses nothing."""

from __future__ import annotations

import random
import signal
import socket
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import structlog.testing
import trio

from actors.domain.errors import LayoutMismatch
from actors.domain.misfires import plan_fires
from actors.domain.model import TaskSpec
from actors.domain.schedules import Overlap, Schedule
from actors.scheduling.claim_loop import (
    TICK_FIRES,
    RateMeter,
    TickResult,
    paced_pause_s,
    shortest_pause_s,
)
from actors.scheduling.ownership import Membership, wanted_partitions
from actors.scheduling.poller import Poller, PollerSettings
from actors.store import lua
from actors.store.claim_replies import decode_state
from actors.store.codes import DEFINITION_VALUES, STATE_NEXT_MS, STATE_STATUS
from actors.store.definitions import DEFAULT_CACHED_DEFINITIONS
from actors.store.enqueue import enqueue_fires
from actors.store.flights import ENDED_OK, FlightEnd
from actors.store.keys import Keys
from actors.store.ledger import task_history
from actors.store.messages import Message
from actors.store.migrate import migrate
from actors.store.records import ARRAY_HEADERS, claim_of, pack_values
from actors.store.replies import (
    Commit,
    Fire,
    FireCommit,
    OutcomeWrite,
    PartitionClaim,
    fire_commit,
)
from actors.store.scheduling_scripts import UNREADABLE_AGAIN_MS
from actors.store.scripts import Scripts
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.errors import RedisUnavailable
from runtime.liveness import instance_id
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from runtime.redis_replies import PartRejected
from tests.execution_harness import node_config, running_node
from tests.node_process import NodeProcess
from tests.waiting import eventually, settled


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def stream_fires(store: TaskStore, task_type: str) -> list[dict[str, str]]:
    """The stream's messages as a consumer reads them (either form: every field)."""
    keys = await store.keys()
    entries = await store.client.execute("XRANGE", keys.queue(task_type), "-", "+")
    return [Message.decode(i, fields, task_type).fields() for i, fields in entries]


async def raw_fires(store: TaskStore, task_type: str) -> list[tuple[str, dict[str, str]]]:
    """The stream's entries as stored: (entry id, fields)."""
    keys = await store.keys()
    entries = await store.client.execute("XRANGE", keys.queue(task_type), "-", "+")
    return [(i.decode(), {k.decode(): v.decode() for k, v in f.items()}) for i, f in entries]


async def run_pollers(
    store: TaskStore,
    count: int,
    seconds: float = 0.0,
    until: Callable[[], Awaitable[bool]] | None = None,
    **settings: Any,
) -> None:
    """Run ``count`` pollers for ``seconds``, or until ``until()`` holds (60 s at most)."""
    async with trio.open_nursery() as nursery:
        for i in range(count):
            poller = Poller(store, PollerSettings(**settings))
            ctx = ActorContext(f"node/poller-{i}", 1.0, get_logger(actor=f"node/poller-{i}"))
            await nursery.start(poller.run, ctx)
        if until is None:
            await trio.sleep(seconds)
        else:
            await eventually(until, 60, poll_s=0.05)
        nursery.cancel_scope.cancel()


# -- the scripts, table-driven ------------------------------------------------------------


_claims = iter(range(1, 10**9))


async def claim(
    store: TaskStore, poller: str, limit: int = 100, lease_ms: int = 60_000
) -> tuple[str, PartitionClaim]:
    """``poller`` claims partition 0 under a fresh token: (the token, the claim)."""
    token = f"{poller}-{next(_claims)}"
    scripts = await store.scripts()
    (partition,) = await scripts.claim_due([0], poller, token, limit, lease_ms)
    return token, partition


async def commit(
    store: TaskStore, poller: str, token: str, claimed: PartitionClaim, *groups: Any
) -> Commit:
    """Groups as (task_id, next_ms, score, fired), for tasks of ``claimed``."""
    tasks = {t.task_id: t for t in claimed.tasks}
    commits = [
        fire_commit(tasks[task_id], next_ms, score, fired)
        for task_id, next_ms, score, fired in groups
    ]
    scripts = await store.scripts()
    return (await scripts.commit_fires(poller, token, {0: commits}, {0: claimed.writes}))[0]


async def owner(store: TaskStore, partition: int) -> dict[str, str]:
    keys = await store.keys()
    raw = await store.client.execute("HGETALL", keys.partition_owner(partition))
    return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.fixture
async def one_partition(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=1)


async def test_a_claim_takes_the_partition_and_writes_nothing_per_task(
    one_partition: TaskStore,
) -> None:
    store = one_partition
    past = await store.now_ms() - 1000
    await store.create(TaskSpec("t", Schedule("once", at_ms=past), task_id="due"))
    await store.create(TaskSpec("t", Schedule("once", at_ms=past + 10**7), task_id="later"))
    keys = await store.keys()
    state_before = await store.client.execute("HGET", keys.states(0, keys.bucket_of("due")), "due")
    token, reply = await claim(store, "A", lease_ms=60_000)
    (task,) = reply.tasks
    assert (task.task_id, task.bucket, task.due_ms) == ("due", keys.bucket_of("due"), past)
    assert not reply.held and task.owed_until_ms is None and task.prior_claim == ""
    assert reply.earliest_ms == reply.now_ms  # due by now: the commit reports the real one
    assert float(await store.client.execute("ZSCORE", keys.schedule(0), "due")) == past
    state = await store.client.execute("HGET", keys.states(0, keys.bucket_of("due")), "due")
    assert state == state_before and claim_of(state) is None
    fields = await owner(store, 0)
    newest = max(t.updated_ms for t in await store.get_many(["due", "later"]) if t)
    # raised to the takeover: a task written after it, in the same ms too, gets a later one
    assert int(fields.pop("version")) == max(newest, reply.now_ms)
    # tasks written since the takeover are owed nothing: a version after it is later
    assert int(fields.pop("owed_version")) == max(newest, reply.now_ms)
    assert fields == {
        "poller": "A", "until": str(reply.now_ms + 60_000), "owed": "-1",
        "renewed": str(reply.now_ms), "owed_from": "-1",
        "inflight": f"{token}:{reply.now_ms}",
        "writes": "3",  # the two creates, and the takeover (another poller may have written)
    }  # fmt: skip
    other = (await claim(store, "B"))[1]
    assert other.held and other.tasks == []  # another poller gets nothing while A holds it
    assert (await claim(store, "A"))[1].tasks[0].prior_claim == token  # not committed yet


async def test_an_expired_lease_is_taken_over_with_the_same_due_time(
    one_partition: TaskStore,
) -> None:
    store = one_partition
    past = await store.now_ms() - 1000
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    token_a, first = await claim(store, "A", lease_ms=100)
    assert first.tasks[0].due_ms == past
    await trio.sleep(0.2)
    token_b, again = await claim(store, "B")
    (task,) = again.tasks
    assert task.due_ms == past  # same grid time: same schedule_id
    assert task.prior_claim == token_a  # A's fires may be in the stream: looked up
    assert task.owed_until_ms == again.now_ms  # due before the handover: owed
    # A's late commit is refused (the partition is B's); B's goes through.
    assert (
        await commit(store, "A", token_a, first, ["x", past + 60_000, past + 60_000, 1])
    ).lost == ["x"]
    done = await commit(store, "B", token_b, again, ["x", past + 60_000, past + 60_000, 1])
    assert done.lost == []
    task_now = await store.get("x")
    assert task_now is not None and (task_now.next_run_ms, task_now.fires) == (past + 60_000, 1)
    assert (await owner(store, 0))["inflight"] == f"{token_a}:{first.now_ms}"  # A's: kept


async def test_a_holder_gone_from_this_host_is_taken_over_without_waiting_for_its_lease(
    one_partition: TaskStore,
) -> None:
    """A poller process of this host killed while holding a partition (its supervisor, or
    the node, starts a fresh process): the next poller sees that process is gone and takes
    the partition at once, not a lease later; a live holder's lease is respected."""
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    exited = await trio.lowlevel.open_process(["true"])
    await exited.wait()
    dead = f"{socket.gethostname()}:{exited.pid}:{instance_id()}:feed"
    _, first = await claim(store, dead, lease_ms=600_000)
    assert first.tasks  # held for ten minutes by a process that is gone
    _, other = await claim(store, "elsewhere:1:live")
    assert other.holder == dead  # a holder on another host is trusted until its lease ends
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    scripts = await store.scripts()
    assert (await poller.tick(scripts, poller.partitions(keys), get_logger())).enqueued == 0
    assert (await poller.tick(scripts, poller.partitions(keys), get_logger())).enqueued == 1
    assert (await owner(store, 0))["poller"] == poller.poller_id
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"x:{past}"]


async def test_a_poller_gone_from_this_host_leaves_the_membership_at_once(
    store: TaskStore,
) -> None:
    """A killed scheduler process's poller is still listed as alive for a lease; a poller of
    the same host sees its process has exited, drops it, and wants every partition now."""
    keys = await store.keys()
    exited = await trio.lowlevel.open_process(["true"])
    await exited.wait()
    dead = f"{socket.gethostname()}:{exited.pid}:{instance_id()}:feed"
    until = await store.now_ms() + 600_000
    await store.client.execute("ZADD", keys.pollers, until, dead, until, "elsewhere:1:live")
    poller = Poller(store, PollerSettings())
    poller.membership = Membership(poller.poller_id, keys.partitions, 10_000)
    await poller.round(await store.scripts(), get_logger())
    live = sorted([poller.poller_id, "elsewhere:1:live"])
    assert poller.membership.members == live  # the other host's poller is trusted
    assert poller.membership.wanted == wanted_partitions(poller.poller_id, live, 4)
    assert await store.client.execute("ZSCORE", keys.pollers, dead) is None


async def test_a_member_alive_until_further_ahead_than_any_poller_says_is_dropped(
    store: TaskStore,
) -> None:
    """Another program's entry in the membership, alive until 1e300, would hold partitions
    no poller claims, their tasks never fired; one further ahead than ten leases (an hour
    at least) is dropped. A live poller of another host, within that, is trusted."""
    keys = await store.keys()
    now = await store.now_ms()
    await store.client.execute(
        "ZADD", keys.pollers, "1e300", "ghost", now + 3_500_000, "elsewhere:1:slow"
    )
    scripts = await store.scripts()
    live = await scripts.poller_members("here:1:live", 10_000)
    assert live == ["elsewhere:1:slow", "here:1:live"]
    assert await store.client.execute("ZSCORE", keys.pollers, "ghost") is None


async def test_a_dead_pollers_claimed_fires_are_not_coalesced_away(
    one_partition: TaskStore,
) -> None:
    """A poller claims a due time for 1 s and dies; by the time its lease expires, two more
    grid times have come. All three reach the stream, each with its own schedule_id,
    although the task's misfire policy is coalesce: they were late because of the crash,
    not missed while nothing ran."""
    store = one_partition
    start = await store.now_ms() - 50
    schedule = Schedule("interval", every_s=0.4, start_ms=start)  # misfire: coalesce
    await store.create(TaskSpec("owed", schedule, task_id="x"))
    _, first = await claim(store, "dead", lease_ms=1000)
    fresh = first.tasks[0]
    assert fresh.due_ms == start and fresh.owed_until_ms is None  # a fresh claim
    lease_end = first.now_ms + 1000
    await trio.sleep(1.1)  # the lease expires
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    dues = [int(f["due_ms"]) for f in await stream_fires(store, "owed")]
    blocked = list(range(start, lease_end + 1, 400))
    assert dues[: len(blocked)] == blocked and len(blocked) >= 3
    assert len(dues) <= len(blocked) + 1  # at most one more: due after the lease ended


@pytest.mark.parametrize("version", ["ahead", "missing"])
async def test_a_task_written_before_a_takeover_is_owed_whatever_the_partitions_version(
    one_partition: TaskStore, version: str
) -> None:
    """Versions run ahead of Redis's clock after a burst of writes (each one past the last),
    and a partition whose tasks were only migrated has no version kept: a task written
    before the takeover is owed what the dead claim blocked either way."""
    store = one_partition
    keys = await store.keys()
    now = await store.now_ms()
    if version == "ahead":
        await store.client.execute("HSET", keys.partition_owner(0), "version", now + 3_600_000)
    start = now - 50
    schedule = Schedule("interval", every_s=0.4, start_ms=start, misfire="skip")
    await store.create(TaskSpec("owed", schedule, task_id="x"))
    if version == "missing":
        await store.client.execute("HDEL", keys.partition_owner(0), "version")
    _, first = await claim(store, "dead", lease_ms=1000)
    lease_end = first.now_ms + 1000
    await trio.sleep(1.1)  # the lease expires
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    dues = [int(f["due_ms"]) for f in await stream_fires(store, "owed")]
    blocked = list(range(start, lease_end + 1, 400))
    assert dues[: len(blocked)] == blocked and len(blocked) >= 3


async def test_a_task_written_after_a_takeover_is_not_owed_its_past(
    one_partition: TaskStore,
) -> None:
    """The times owed after a takeover are those a dead poller's claim blocked; a task
    created later, starting in the past, is under its misfire policy like any other
    (``skip``: nothing), however long after the takeover, not fired up to ``misfire_cap``
    times for grid times no claim ever held."""
    store = one_partition
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=now), task_id="x"))
    await claim(store, "dead", lease_ms=1000)
    await trio.sleep(1.1)  # the lease expires
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert len(await stream_fires(store, "t")) == 1  # taken over: the owed fire
    past = Schedule("interval", every_s=0.1, start_ms=now - 60_000, misfire="skip")
    await store.create(TaskSpec("late", past, task_id="late"))
    for _ in range(3):
        await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert await stream_fires(store, "late") == []
    task = await store.get("late")
    assert task is not None and task.next_run_ms is not None and task.next_run_ms > now


@pytest.mark.parametrize("write", ["created", "updated"])
async def test_a_task_written_while_its_partition_had_no_poller_is_owed_a_lease_at_most(
    one_partition: TaskStore, write: str
) -> None:
    """A task created (or given a new schedule) after its partition's poller died, before
    another took over, starting a minute in the past under ``skip``: the takeover owes
    the grid times from the dead poller's last renewal at most (it was claiming until
    then); the minute before that is under its policy (skipped), not fired up to
    ``misfire_cap`` times."""
    store = one_partition
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=now), task_id="x"))
    if write == "updated":  # far from due until its new schedule
        later = Schedule("interval", every_s=3600, start_ms=now + 3_600_000)
        await store.create(TaskSpec("late", later, task_id="late"))
    await claim(store, "dead", lease_ms=1000)
    await trio.sleep(1.1)  # the lease expires: no live poller now
    past = Schedule("interval", every_s=0.5, start_ms=now - 60_000, misfire="skip")
    if write == "updated":
        await store.update("late", schedule=past)
    else:
        await store.create(TaskSpec("late", past, task_id="late"))
    keys = await store.keys()
    lease_ms = 2000
    poller = Poller(store, PollerSettings(claim_lease_ms=lease_ms))
    takeover = await store.now_ms()
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    dues = [int(f["due_ms"]) for f in await stream_fires(store, "late")]
    assert dues and min(dues) >= takeover - 2 * lease_ms - 500, (takeover, dues)
    assert len(dues) <= 2 * lease_ms // 500 + 2, dues


async def test_a_dead_claim_under_a_longer_lease_than_the_takers_is_owed_from_its_renewal(
    one_partition: TaskStore,
) -> None:
    """The dead poller claimed under a 6 s lease, its taker claims under 0.5 s. A task
    created after the dead poller's last renewal, starting in the past under ``skip``, and
    claimed by it before it died: every grid time after that claim to the owed end is owed
    (the claim blocked them), counted from the renewal kept in the owner hash, not from
    two of the taker's leases before the owed end."""
    store = one_partition
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=now), task_id="x"))
    await claim(store, "dead", lease_ms=6000)  # takes the partition: renewed now
    renewed = int((await owner(store, 0))["until"]) - 6000
    past = Schedule("interval", every_s=0.25, start_ms=now - 60_000, misfire="skip")
    await store.create(TaskSpec("late", past, task_id="late"))
    _, blocked = await claim(store, "dead", lease_ms=6000)  # claims it, dies uncommitted
    assert "late" in {t.task_id for t in blocked.tasks}
    assert int((await owner(store, 0))["renewed"]) == renewed  # not renewed again
    await trio.sleep(6.2)  # the lease expires
    keys = await store.keys()
    lease_ms = 500
    poller = Poller(store, PollerSettings(claim_lease_ms=lease_ms))
    takeover = await store.now_ms()  # the takeover's claim comes after: due by then
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    dues = {int(f["due_ms"]) for f in await stream_fires(store, "late")}
    owed_end = min(takeover, renewed + 6000 + lease_ms)
    grid = range(now - 60_000, owed_end + 1, 250)
    missing = [t for t in grid if t > blocked.now_ms and t not in dues]
    assert not missing, (blocked.now_ms, owed_end, missing)
    assert min(dues) >= renewed - 250, (renewed, sorted(dues)[:3])


async def test_a_task_written_after_a_claim_has_a_later_version_than_its_renewal(
    one_partition: TaskStore,
) -> None:
    """A takeover decides which tasks were written after the dead owner's last renewal
    by their version (``updated_ms > owed_from``): a task written in the same millisecond
    as the renewal, after it, must count as later, or the takeover fires up to
    ``misfire_cap`` of its past times instead of applying its policy to them. Taken
    and released many times over, so some writes fall in the renewal's millisecond."""
    store = one_partition
    scripts = await store.scripts()
    for i in range(60):
        await claim(store, f"p{i}", lease_ms=60_000)  # takes it over: renewed now
        renewed = int((await owner(store, 0))["renewed"])
        await store.create(TaskSpec("t", Schedule("interval", every_s=60), task_id=f"t{i}"))
        task = await store.get(f"t{i}")
        assert task is not None and task.updated_ms > renewed, (i, renewed)
        assert await scripts.release_partitions([0], f"p{i}") == [0]
        released = int((await owner(store, 0))["renewed"])
        await store.update(f"t{i}", payload={"after": "release"})
        task = await store.get(f"t{i}")
        assert task is not None and task.updated_ms > released, (i, released)


async def test_a_task_two_dead_owners_held_in_a_row_is_owed_every_time_they_blocked(
    one_partition: TaskStore,
) -> None:
    """A claims a task and dies; B takes the partition over, claims it (owed since A's
    renewal) and dies before committing too; C takes over from B. The times A's death
    blocked were B's to owe: C owes them as well, not only those after B's renewal
    (under ``skip`` they would be lost)."""
    store = one_partition
    start = await store.now_ms() - 2000
    skip = Schedule("interval", every_s=0.25, start_ms=start, misfire="skip")
    await store.create(TaskSpec("chain", skip, task_id="x"))
    await claim(store, "A", lease_ms=1000)
    await trio.sleep(1.1)
    _, by_b = await claim(store, "B", lease_ms=1000)
    (task,) = by_b.tasks
    assert task.owed_until_ms is not None  # B's to owe
    await trio.sleep(1.1)
    keys = await store.keys()
    poller = Poller(store, PollerSettings(claim_lease_ms=1000))
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    dues = {int(f["due_ms"]) for f in await stream_fires(store, "chain")}
    blocked = range(start, task.owed_until_ms + 1, 250)
    assert not [t for t in blocked if t not in dues], (sorted(dues), list(blocked))


@pytest.mark.parametrize("renewed", ["ahead", "missing"])
async def test_a_takeover_owes_every_time_when_the_old_renewal_is_unknown_or_ahead(
    one_partition: TaskStore, renewed: str
) -> None:
    """A renewal later than the taker's clock (a clock that stepped back), or none (an
    owner hash of an earlier version), tells nothing: every time from the due one is
    owed (``owed_from`` NONE)."""
    store = one_partition
    now = await store.now_ms()
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=now), task_id="x"))
    await claim(store, "dead", lease_ms=1000)
    keys = await store.keys()
    if renewed == "ahead":
        await store.client.execute("HSET", keys.partition_owner(0), "renewed", now + 600_000)
    else:
        await store.client.execute("HDEL", keys.partition_owner(0), "renewed")
    await trio.sleep(1.1)  # the lease expires
    _, taken = await claim(store, "taker", lease_ms=2000)
    (task,) = taken.tasks
    fields = await owner(store, 0)
    assert task.owed_until_ms is not None and task.owed_from_ms is None
    assert fields["owed_from"] == "-1" and int(fields["renewed"]) == taken.now_ms


class EndsAFireBeforeCommitting(Poller):
    """A poller during whose tick, after its overlap decisions and before its commit, a
    consumer ends the fire in flight (``end_flights.lua``)."""

    ends: list[FlightEnd] = []

    async def _apply_policies(self, scripts: Scripts, token: str, plan: Any, writes: Any) -> Any:
        decided = await super()._apply_policies(scripts, token, plan, writes)
        if self.ends:
            await scripts.end_flights(self.ends)
            self.ends = []
        return decided


async def test_a_fire_ending_between_a_claim_and_its_commit_wakes_the_one_waiting(
    one_partition: TaskStore,
) -> None:
    """A claim puts a grid time behind the fire in flight (``buffer_one``); that fire ends
    before the claim's commit, so its end finds the task claimed and cannot wake it. The
    commit does: the waiting fire starts next tick, not a grid time (or an hour) later."""
    store = one_partition
    start = await store.now_ms() - 10
    schedule = Schedule("interval", every_s=2, start_ms=start, overlap="buffer_one")
    await store.create(TaskSpec("work", schedule, task_id="b"))
    keys = await store.keys()
    poller = EndsAFireBeforeCommitting(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert [int(f["due_ms"]) for f in await stream_fires(store, "work")] == [start]
    await trio.sleep((start + 2100 - await store.now_ms()) / 1000)  # the next grid time comes
    poller.ends = [FlightEnd("b", ENDED_OK, start)]  # ends right after the claim's decision
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert [int(f["due_ms"]) for f in await stream_fires(store, "work")] == [start, start + 2000]


async def test_a_new_schedule_is_not_held_to_the_grid_times_the_old_one_decided(
    one_partition: TaskStore,
) -> None:
    """A task under ``skip`` keeps the latest grid time a claim decided, so a repeated
    claim decides none twice. Its new schedule is a new grid: a one-shot at a time before
    that mark still fires."""
    store = one_partition
    start = await store.now_ms() - 10
    every = Schedule("interval", every_s=60, start_ms=start, overlap="skip")
    await store.create(TaskSpec("work", every, task_id="s"))
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    await (await store.scripts()).end_flights([FlightEnd("s", ENDED_OK, start)])
    await store.update("s", schedule=Schedule("once", at_ms=start - 1000, overlap="skip"))
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert [int(f["due_ms"]) for f in await stream_fires(store, "work")] == [start, start - 1000]


async def test_commit_of_a_finished_task_removes_it_from_the_schedule(
    one_partition: TaskStore,
) -> None:
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("once", at_ms=past), task_id="once"))
    token, claimed = await claim(store, "A")
    done = await commit(store, "A", token, claimed, ["once", None, None, 1])
    assert done.earliest_ms is None  # zset empty
    assert (await owner(store, 0))["inflight"] == ""  # the claim is done
    task = await store.get("once")
    assert task is not None and (task.status, task.next_run_ms, task.fires) == ("finished", None, 1)


async def test_pausing_a_claimed_task_voids_the_claim(one_partition: TaskStore) -> None:
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=1, start_ms=past), task_id="p"))
    token, claimed = await claim(store, "A")
    await store.pause("p")
    assert (await commit(store, "A", token, claimed, ["p", past + 1000, past + 1000, 1])).lost == [
        "p"
    ]
    keys = await store.keys()
    assert await store.client.execute("ZSCORE", keys.schedule(0), "p") is None


@pytest.mark.parametrize(
    "write", ["pause", "stop", "new payload", "new schedule", "delete", "delete and create"]
)
async def test_an_api_write_between_claim_and_commit_voids_only_its_own_tasks_claim(
    one_partition: TaskStore, write: str
) -> None:
    """A commit writes the poller's new states without reading them while the partition has
    had no API write since the claim; after one, it checks each task: the one written is
    lost and left as the write put it, the others of the claim commit. A task paused or
    stopped on the grid time claimed gets the claim's fire counted (it is in the stream),
    all else as the write put it."""
    store = one_partition
    past = await store.now_ms() - 1000
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ("a", "b")])
    token, claimed = await claim(store, "A")
    if write in ("pause", "stop"):
        await getattr(store, write)("b")
    elif write == "new payload":
        await store.update("b", payload={"v": 2})
    elif write == "new schedule":
        await store.update("b", schedule=Schedule("interval", every_s=3600, start_ms=past))
    else:
        await store.delete("b")
        if write == "delete and create":
            await store.create(TaskSpec("t", Schedule("interval", every_s=30), task_id="b"))
    written = await store.get("b")
    nxt = past + 60_000
    done = await commit(store, "A", token, claimed, ["a", nxt, nxt, 1], ["b", nxt, nxt, 1])
    assert done.lost == ["b"]
    if write in ("pause", "stop"):
        assert written is not None
        written = attrs.evolve(written, fires=1)
    assert await store.get("b") == written
    a = await store.get("a")
    assert a is not None and (a.next_run_ms, a.fires, a.status) == (nxt, 1, "active")


async def _definition_not_a_record(store: TaskStore, keys: Keys) -> None:
    await store.client.execute(
        "HSET", keys.definitions(0, keys.bucket_of("bad")), "bad", b"\xc1 not a record"
    )


async def _next_time_a_string(store: TaskStore, keys: Keys) -> None:
    """A state record that decodes, its next time a string (a hand edit)."""
    states = keys.states(0, keys.bucket_of("bad"))
    values = decode_state(await store.client.execute("HGET", states, "bad"))
    values[STATE_NEXT_MS] = str(values[STATE_NEXT_MS])
    await store.client.execute("HSET", states, "bad", pack_values(values))


async def _status_none_has(store: TaskStore, keys: Keys) -> None:
    """A state record that decodes, its status a code no version writes (a hand edit)."""
    states = keys.states(0, keys.bucket_of("bad"))
    values = decode_state(await store.client.execute("HGET", states, "bad"))
    values[STATE_STATUS] = 7
    await store.client.execute("HSET", states, "bad", pack_values(values))


async def _payload_not_text(store: TaskStore, keys: Keys) -> None:
    """A definition record that decodes, its payload a map, not JSON text (another
    program): an enqueue's XADD refuses it after the fires before it in its call."""
    definitions = keys.definitions(0, keys.bucket_of("bad"))
    raw = await store.client.execute("HGET", definitions, "bad")
    task_type, _, schedule, created = msgpack.unpackb(
        ARRAY_HEADERS[DEFINITION_VALUES] + raw, raw=True
    )
    record = pack_values([task_type, {"to": "x"}, schedule, created])
    await store.client.execute("HSET", definitions, "bad", record)


async def _state_of_another_layout(store: TaskStore, keys: Keys) -> None:
    """A state record written as one MessagePack array (its first byte not a status)."""
    states = keys.states(0, keys.bucket_of("bad"))
    values = decode_state(await store.client.execute("HGET", states, "bad"))
    await store.client.execute("HSET", states, "bad", msgpack.packb(values))


async def _definition_gone(store: TaskStore, keys: Keys) -> None:
    """A state left without its definition (a partial delete or restore)."""
    await store.client.execute("HDEL", keys.definitions(0, keys.bucket_of("bad")), "bad")


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (_definition_not_a_record, "not MessagePack"),
        (_definition_gone, "without a definition record"),
        (_next_time_a_string, "whole numbers"),
        (_state_of_another_layout, "values, not 9"),
        (_status_none_has, "status 7 is none"),
        (_payload_not_text, "payload must be JSON text"),
    ],
)
@pytest.mark.parametrize("cache", [PollerSettings().definition_cache, 0])
async def test_a_due_task_whose_records_do_not_decode_is_named_once_and_looked_at_later(
    one_partition: TaskStore,
    spoil: Callable[[TaskStore, Keys], Awaitable[None]],
    said: str,
    cache: int,
) -> None:
    """Records written by something else (a hand edit, a foreign version) stop neither the
    poller nor the other tasks of the partition: the task is named once, saying what is
    wrong, and stays in the schedule, due again a few seconds on (every claim took it first,
    before the tasks due after it). Also for a record that decodes but holds a value of
    another kind, on the claims with and without definitions (with a cache, its second
    tick; without one, the claim that reads them all): a tick that raised would restart
    the poller, and every poller that took the partition over."""
    store = one_partition
    past = await store.now_ms() - 1000
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ("good", "bad")])
    keys = await store.keys()
    await spoil(store, keys)
    poller = Poller(store, PollerSettings(definition_cache=cache))
    scripts = await store.scripts()
    with structlog.testing.capture_logs() as logs:
        first = await poller.tick(scripts, [0], get_logger())
        deferred = float(await store.client.execute("ZSCORE", keys.schedule(0), "bad"))
        await store.client.execute("ZADD", keys.schedule(0), past, "bad")  # due again
        second = await poller.tick(scripts, [0], get_logger())
    assert (first.enqueued, second.enqueued) == (1, 0)
    named = [e for e in logs if e["event"] == "task_unreadable"]
    assert [e["task_id"] for e in named] == ["bad"], logs
    assert said in named[0]["error"]
    assert deferred >= past + 1000 + UNREADABLE_AGAIN_MS
    assert float(await store.client.execute("ZSCORE", keys.schedule(0), "bad")) > past
    good = await store.get("good")
    assert good is not None and good.next_run_ms == past + 60_000


async def test_due_tasks_that_cannot_be_read_hold_no_claims_place(
    one_partition: TaskStore,
) -> None:
    """More due tasks whose records cannot be read than a claim takes, due before a good
    one: the good one still fires within a few ticks (each claim took the broken ones
    first, for ever, and the partition fired nothing else)."""
    store = one_partition
    past = await store.now_ms() - 10_000
    bad = [f"bad{i}" for i in range(5)]
    await store.create_many(
        [TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id=i) for i in bad]
    )
    await store.create(
        TaskSpec("t", Schedule("interval", every_s=60, start_ms=past + 5000), task_id="good")
    )
    keys = await store.keys()
    for task_id in bad:
        await store.client.execute("HDEL", keys.definitions(0, keys.bucket_of(task_id)), task_id)
    poller = Poller(store, PollerSettings(batch_size=2))
    scripts = await store.scripts()
    enqueued = [(await poller.tick(scripts, [0], get_logger())).enqueued for _ in range(4)]
    assert sum(enqueued) == 1
    good = await store.get("good")
    assert good is not None and good.fires == 1


async def test_a_task_written_since_its_claim_named_it_unreadable_is_not_moved(
    one_partition: TaskStore,
) -> None:
    """The move a few seconds on is skipped when an API write came to the
    partition since the claim (the task mended, or deleted and created again: its first
    fire is not put off, which a short catch-up window would then drop)."""
    store = one_partition
    past = await store.now_ms() - 1000
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    writes = int(await store.client.execute("HGET", keys.partition_owner(0), "writes"))
    now = await store.now_ms()

    def claim(seen: int) -> PartitionClaim:
        return PartitionClaim(0, now, None, [], writes=seen, unreadable=[("x", "broken")])

    await scripts.defer_unreadable([claim(writes - 1)])
    assert float(await store.client.execute("ZSCORE", keys.schedule(0), "x")) == past
    await scripts.defer_unreadable([claim(writes)])
    moved = float(await store.client.execute("ZSCORE", keys.schedule(0), "x"))
    assert moved == now + UNREADABLE_AGAIN_MS


async def test_a_poller_set_to_other_partitions_than_its_namespace_has_says_so(
    store: TaskStore,
) -> None:
    """Partitions are fixed when a namespace is first used: a node set to another number
    serves the stored ones and its pollers say so; one set to the stored number, or not
    set, says nothing."""
    with structlog.testing.capture_logs() as logs:
        for n, settings in enumerate([{"partitions": 8}, {"partitions": 4}, {}], 1):

            async def logged(n: int = n) -> bool:  # it reads the layout once started
                return bool(sum(e["event"] == "poller_ready" for e in logs) >= n)

            await run_pollers(store, 1, until=logged, **settings)
    ready = [e for e in logs if e["event"] == "poller_ready"]
    assert [e["of"] for e in ready] == [4, 4, 4]
    differ = [e for e in logs if e["event"] == "partitions_differ"]
    assert [(e["configured"], e["stored"]) for e in differ] == [(8, 4)], differ
    assert "has 4 (fixed when it was first used)" in differ[0]["error"]


async def test_a_node_set_to_other_partitions_warns_from_its_poller(
    store: TaskStore, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The node's ``[scheduler] partitions`` reaches its pollers (the tree wires it)."""
    await store.keys()  # the namespace, with 4 partitions
    config = node_config(redis_url, namespace, tmp_path, {})
    config = attrs.evolve(config, scheduler=attrs.evolve(config.scheduler, partitions=8))
    with structlog.testing.capture_logs() as logs:
        async with running_node(config):
            await eventually(lambda: any(e["event"] == "poller_ready" for e in logs), 30)
    differ = [e for e in logs if e["event"] == "partitions_differ"]
    assert [(e["configured"], e["stored"]) for e in differ] == [(8, 4)], differ


async def test_an_outcome_between_claim_and_commit_is_kept(one_partition: TaskStore) -> None:
    """Outcomes write the run record, never the state the commit writes unread: a run that
    ends between a claim and its commit still counts."""
    store = one_partition
    past = await store.now_ms() - 1000
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    token, claimed = await claim(store, "A")
    scripts = await store.scripts()
    assert await scripts.record_outcomes([OutcomeWrite("x", 0, past + 5, "")]) == 1
    done = await commit(store, "A", token, claimed, ["x", past + 60_000, past + 60_000, 1])
    assert done.lost == []
    task = await store.get("x")
    assert task is not None
    assert (task.next_run_ms, task.fires, task.runs, task.last_run_ms, task.last_status) == (
        past + 60_000, 1, 1, past + 5, "ok",
    )  # fmt: skip


async def test_a_task_changed_between_claim_and_commit_is_not_fired_twice(
    one_partition: TaskStore,
) -> None:
    """An API write between claim and commit wins: the commit leaves that task alone. A new
    payload does not move the grid time, so the next tick claims the same fire again; it
    finds the first claim's fire in the stream and does not append it twice."""
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="u"))
    keys = await store.keys()
    poller = Poller(store, PollerSettings())

    class UpdateBeforeCommit(Scripts):
        """The API write lands between the claim and the enqueue-and-commit round trip."""

        async def enqueue_and_commit(
            self, *args: Any, **kwargs: Any
        ) -> tuple[list[bool], dict[int, Commit], list[PartRejected]]:
            await store.update("u", payload={"v": 2})
            return await super().enqueue_and_commit(*args, **kwargs)

    await poller.tick(UpdateBeforeCommit(store.client, keys), poller.partitions(keys), get_logger())
    scripts = await store.scripts()
    task = await store.get("u")
    assert task is not None and (task.next_run_ms, task.fires) == (past, 0)  # not committed
    result = await poller.tick(scripts, poller.partitions(keys), get_logger())
    assert result.enqueued == 1  # claimed again, its fire found in the stream
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"u:{past}"]
    task = await store.get("u")
    assert task is not None and (task.next_run_ms, task.fires) == (past + 60_000, 1)


async def test_claim_drops_index_entries_of_deleted_tasks(one_partition: TaskStore) -> None:
    store = one_partition
    keys = await store.keys()
    await store.client.execute("ZADD", keys.schedule(0), 1, "ghost")
    assert (await claim(store, "A"))[1].tasks == []
    assert await store.client.execute("ZCARD", keys.schedule(0)) == 0


async def test_a_fire_enqueued_again_after_a_poller_died_is_dropped(
    one_partition: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A poller appends a fire and dies before committing; when the fire is claimed again
    after the lease, the second append is dropped: the stream holds it once."""
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    keys = await store.keys()
    token, _ = await claim(store, "dead-poller", lease_ms=100)
    fire = Fire("x", "t", b"null", past)
    await enqueue_fires(await store.scripts(), [fire], past, "dead-poller", 60_000, token)
    await trio.sleep(0.2)  # the dead poller's claim expires
    poller = Poller(store, PollerSettings(dedupe_window_ms=60_000))
    result = await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert result.enqueued == 1  # claimed and handled...
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"x:{past}"]  # ...once
    dropped = [e for e in log_lines() if e["event"] == "duplicate_dropped"]
    assert [e["schedule_id"] for e in dropped] == [f"x:{past}"]
    task = await store.get("x")
    assert task is not None and task.next_run_ms == past + 60_000  # and committed


async def test_enqueue_markers_are_one_per_claim_and_answer_a_repeated_call(
    store: TaskStore,
) -> None:
    """Dedupe writes one marker per claim and stream, not one key per fire; the same call
    repeated (its reply lost) answers as the first time and appends nothing; a claim that
    took over names the old one and only what that one appended is dropped."""
    scripts = await store.scripts()
    keys = await store.keys()
    fires = [Fire(f"t{i}", "m", b"null", 1000 + i) for i in range(300)]
    first = await scripts.enqueue(fires, 5000, 60_000, "claim-1")
    assert first == [True] * 300
    markers = await store.client.execute("KEYS", keys.enqueued_prefix("m") + "*")
    assert markers == [(keys.enqueued_prefix("m") + "claim-1").encode()]
    assert await scripts.enqueue(fires, 5000, 60_000, "claim-1") == first  # a repeated call
    assert len(await stream_fires(store, "m")) == 300
    # claim-2 took over t0..t9 from claim-1 (which appended them) and t10 from claim-x
    # (which appended nothing): only t0..t9 are dropped.
    again = [Fire(f"t{i}", "m", b"null", 1000 + i, prior="claim-1") for i in range(10)]
    again += [Fire("t10", "m", b"null", 1010, prior="claim-x")]
    again += [Fire("t0", "m", b"null", 2000, prior="claim-1")]  # a later grid time: new
    assert await scripts.enqueue(again, 6000, 60_000, "claim-2") == [False] * 10 + [True] * 2
    # and a third claim taking over from claim-2 knows what claim-2 found appended
    third = [Fire("t3", "m", b"null", 1003, prior="claim-2")]
    assert await scripts.enqueue(third, 7000, 60_000, "claim-3") == [False]
    assert len(await stream_fires(store, "m")) == 302


async def test_enqueue_deletes_the_markers_of_claims_committed_in_full(
    store: TaskStore,
) -> None:
    """The claims a caller names as committed lose their markers in that type's stream
    (in the type's first call); other claims' markers, and other types', stay."""
    scripts = await store.scripts()
    keys = await store.keys()
    for token in ("claim-1", "claim-2"):
        await scripts.enqueue([Fire("a", "m", b"null", 1000), Fire("b", "n", b"null", 1000)],
                              5000, 60_000, token)  # fmt: skip
    fires = [Fire(f"t{i}", "m", b"null", 2000 + i) for i in range(600)]  # two calls
    await scripts.enqueue(fires, 6000, 60_000, "claim-3", {"m": ["claim-1"], "n": ["claim-2"]})

    async def markers(task_type: str) -> set[str]:
        prefix = keys.enqueued_prefix(task_type)
        found = await store.client.execute("KEYS", prefix + "*")
        return {k.decode().removeprefix(prefix) for k in found}

    assert await markers("m") == {"claim-2", "claim-3"}
    assert await markers("n") == {"claim-1", "claim-2"}  # no fire of n: nothing went


async def test_a_commit_larger_than_one_zadd_call_moves_every_task(
    one_partition: TaskStore,
) -> None:
    """The commit writes the zset a thousand arguments a call: 700 tasks of one partition
    (1,400 ZADD arguments) all move to their next grid time in one tick."""
    store = one_partition
    now = await store.now_ms()
    schedule = Schedule("interval", every_s=60, start_ms=now - 10)
    await store.create_many([TaskSpec("m", schedule, task_id=f"z{i}") for i in range(700)])
    keys = await store.keys()
    poller = Poller(store, PollerSettings(dedupe_window_ms=60_000))
    result = await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert result.enqueued == 700
    scores = await store.client.execute("ZRANGE", keys.schedule(0), 0, -1, "WITHSCORES")
    assert len(scores) == 700 and all(float(s) > now for _, s in scores)


async def test_a_ticking_poller_keeps_only_its_last_claims_markers(store: TaskStore) -> None:
    """Markers are for claims a poller may not have committed: once a claim is committed
    in full, the poller's next enqueue deletes its markers, so a busy stream holds one
    claim's (not every fire of the dedupe window)."""
    now = await store.now_ms()
    await store.create_many(
        [
            TaskSpec("m", Schedule("interval", every_s=0.2, start_ms=now), task_id=f"k{i}")
            for i in range(20)
        ]
    )
    keys = await store.keys()
    prefix = keys.enqueued_prefix("m")
    ticks_with_fires = 0
    poller = Poller(store, PollerSettings(dedupe_window_ms=60_000))
    with trio.fail_after(30):
        while ticks_with_fires < 5:
            result = await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
            ticks_with_fires += result.enqueued > 0
            await trio.sleep(0.05)
    assert len(await stream_fires(store, "m")) >= 5
    assert len(await store.client.execute("KEYS", prefix + "*")) == 1


# -- the actor ------------------------------------------------------------------------------


@pytest.mark.parametrize("definition_cache", [DEFAULT_CACHED_DEFINITIONS, 0])
async def test_due_tasks_reach_their_stream_once_per_due_time(
    store: TaskStore, debug_log_lines: Callable[[], list[dict[str, Any]]], definition_cache: int
) -> None:
    log_lines = debug_log_lines  # "scheduled" and "queued" are debug lines
    # A second for the poller to come up on a loaded machine; fire_all: a claim more than
    # one interval late (a stalled machine) fires every grid time it finds due, no gap.
    start = await store.now_ms() + 1000
    every = Schedule("interval", every_s=0.2, start_ms=start, misfire="fire_all")
    specs = [TaskSpec("beat", every, i) for i in range(30)]
    ids = {c.task_id for c in await store.create_many(specs)}

    async def five_each() -> bool:
        counts = Counter(f["task_id"] for f in await stream_fires(store, "beat"))
        return len(counts) == len(ids) and min(counts.values()) >= 5

    await run_pollers(store, 1, until=five_each, max_tick_s=0.05, definition_cache=definition_cache)
    logs = log_lines()
    by_task: dict[str, list[int]] = defaultdict(list)
    for fire in await stream_fires(store, "beat"):
        assert fire["schedule_id"] == f"{fire['task_id']}:{fire['due_ms']}"
        assert fire["attempt"] == "0"
        assert int(fire["enq_ms"]) >= int(fire["due_ms"])
        by_task[fire["task_id"]].append(int(fire["due_ms"]))
    assert set(by_task) == ids
    for dues in by_task.values():
        assert dues == [start + 200 * k for k in range(len(dues))]  # drift-free, no gaps
        assert len(dues) >= 5
    queued = [e for e in logs if e["event"] == "queued"]
    assert all(e["enqueue_lag_ms"] >= 0 for e in queued)
    assert {e["actor"] for e in queued} == {"node/poller-0"}
    logged = {(e["task_id"], e["schedule_id"]) for e in queued}
    assert len(logged) == len(queued)  # a line a fire
    in_stream = {(t, f"{t}:{due}") for t, dues in by_task.items() for due in dues}
    # Every fire but those of a tick the pollers' stop cut off between its append and its
    # lines (each task's last one at most) has its line.
    assert logged <= in_stream
    assert all(sid == f"{t}:{max(by_task[t])}" for t, sid in in_stream - logged)
    scheduled = [e for e in logs if e["event"] == "scheduled"]
    # one claim per fire, but for a claim late enough to find two grid times due
    assert 0 < len(scheduled) <= len(in_stream)


async def test_a_task_created_while_its_partition_had_nothing_due_is_noticed(
    store: TaskStore,
) -> None:
    """Rounds skip partitions with nothing due, but look at each again within
    ``max_tick_s``: a task created for now in a quiet partition still fires."""
    keys = await store.keys()
    later = await store.now_ms() + 3_600_000
    await store.create_many(
        [TaskSpec("quiet", Schedule("once", at_ms=later), task_id=f"q{p}") for p in range(8)]
    )

    async def created_and_fired() -> bool:
        if not await store.get("now"):
            await trio.sleep(1.0)  # rounds have seen every partition quiet by then
            await store.create(TaskSpec("quiet", Schedule("once", at_ms=0), task_id="now"))
        return int(await store.client.execute("XLEN", keys.queue("quiet"))) == 1

    await run_pollers(store, 1, until=created_and_fired, max_tick_s=0.2)
    (fire,) = await stream_fires(store, "quiet")
    assert fire["task_id"] == "now"


async def test_task_payload_and_type_reach_the_message(store: TaskStore) -> None:
    payload = {"to": "ops@example.com", "n": [1, 2]}
    await store.create(TaskSpec("mail", Schedule("once", at_ms=0), payload, task_id="m1"))
    await run_pollers(store, 1, 0.3)
    (fire,) = await stream_fires(store, "mail")
    assert fire["payload"] == '{"n":[1,2],"to":"ops@example.com"}'
    assert fire["type"] == "mail"
    assert fire["schedule_id"] == "m1:0"
    task = await store.get("m1")
    assert task is not None and task.status == "finished"


async def test_a_new_namespace_appends_compact_messages_read_as_the_full_form(
    store: TaskStore,
) -> None:
    """Four fields a fire; what the full form adds is derived as it would have been written."""
    await store.create(TaskSpec("mail", Schedule("once", at_ms=5), {"n": 1}, task_id="m1"))
    keys = await store.keys()
    assert keys.compact_messages
    assert await store.client.execute("HGET", keys.meta, "messages") == b"2"
    await run_pollers(store, 1, 0.3)
    ((entry_id, fields),) = await raw_fires(store, "mail")
    assert fields == {"task_id": "m1", "payload": '{"n":1}', "attempt": "0", "due_ms": "5"}
    (fire,) = await stream_fires(store, "mail")
    assert fire == {
        "task_id": "m1", "schedule_id": "m1:5", "type": "mail", "payload": '{"n":1}',
        "attempt": "0", "due_ms": "5", "enq_ms": entry_id.split("-")[0],
    }  # fmt: skip


async def test_a_namespace_an_older_version_made_keeps_the_full_form_until_migrated(
    redis_client: RedisClient, namespace: str
) -> None:
    """No ``messages`` in its meta key: nodes of an older version may read its streams, so
    fires keep all seven fields; ``metronome migrate`` switches it (a node's next start)."""
    older = TaskStore(redis_client, namespace)
    await older.keys()
    await redis_client.execute("HDEL", f"{namespace}:meta", "messages")  # as 0.x wrote it
    store = TaskStore(redis_client, namespace)
    assert not (await store.keys()).compact_messages
    await store.create(TaskSpec("mail", Schedule("once", at_ms=5), {"n": 1}, task_id="m1"))
    await run_pollers(store, 1, 0.3)
    ((_, fields),) = await raw_fires(store, "mail")
    assert set(fields) == {"task_id", "schedule_id", "type", "payload", "attempt", "due_ms",
                           "enq_ms"}  # fmt: skip
    assert (fields["schedule_id"], fields["type"]) == ("m1:5", "mail")
    assert await migrate(redis_client, namespace) == 0  # at the current layout already
    assert (await TaskStore(redis_client, namespace).keys()).compact_messages


async def test_a_message_form_that_is_not_a_number_is_named(
    redis_client: RedisClient, namespace: str
) -> None:
    await TaskStore(redis_client, namespace).keys()
    await redis_client.execute("HSET", f"{namespace}:meta", "messages", "compact")
    with pytest.raises(LayoutMismatch, match="messages = 'compact', not a message form"):
        await TaskStore(redis_client, namespace).keys()


async def test_three_competing_pollers_enqueue_no_duplicates(store: TaskStore) -> None:
    start = await store.now_ms() + 100
    await store.create_many(
        [TaskSpec("hot", Schedule("interval", every_s=0.1, start_ms=start), i) for i in range(200)]
    )
    keys = await store.keys()

    async def many() -> bool:
        return int(await store.client.execute("XLEN", keys.queue("hot"))) >= 2000

    await run_pollers(store, 3, until=many, max_tick_s=0.02, batch_size=50)
    ids = [f["schedule_id"] for f in await stream_fires(store, "hot")]
    assert len(ids) >= 2000
    assert len(ids) == len(set(ids))


async def test_misfired_tasks_follow_their_policy_after_downtime(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    now = await store.now_ms()
    start = now - 10_500  # 11 grid times passed while nothing ran
    for policy in ("coalesce", "skip", "fire_all"):
        schedule = Schedule("interval", every_s=1, start_ms=start, misfire=policy)
        await store.create(TaskSpec(policy, schedule, task_id=policy))
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    logs = log_lines()
    counts = {p: len(await stream_fires(store, p)) for p in ("coalesce", "skip", "fire_all")}
    assert counts == {"coalesce": 1, "skip": 0, "fire_all": 11}
    (coalesced,) = await stream_fires(store, "coalesce")
    assert int(coalesced["due_ms"]) == start + 10_000
    misfired = {e["task_id"]: e for e in logs if e["event"] == "misfired"}
    assert (misfired["coalesce"]["missed"], misfired["skip"]["missed"]) == (10, 11)
    for policy in ("coalesce", "skip", "fire_all"):
        task = await store.get(policy)
        assert task is not None and task.next_run_ms == start + 11_000


async def test_the_last_grid_times_an_outage_skipped_are_said_and_kept(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A ``skip`` task whose grid ends while nothing runs: its last grid times are missed
    like any others (a ``misfired`` line, a history entry), though no fire and no next
    grid time follow; a task that spent ``max_runs`` misses none."""
    now = await store.now_ms()
    ended = Schedule("interval", every_s=1, start_ms=now - 5_500, end_ms=now - 1_000,
                     misfire="skip")  # fmt: skip
    await store.create(TaskSpec("t", ended, task_id="ended"))
    keys = await store.keys()
    poller = Poller(store, PollerSettings())
    await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    task = await store.get("ended")
    assert task is not None and task.status == "finished"
    assert await stream_fires(store, "t") == []
    (misfired,) = [e for e in log_lines() if e["event"] == "misfired"]
    assert (misfired["task_id"], misfired["missed"]) == ("ended", 5)
    (entry,) = await task_history(store, "ended")
    assert entry.fate == "skipped"
    # max_runs spent while it stayed scheduled (a poller's claim of such a task plans
    # none): nothing missed, nothing said.
    spent = Schedule("interval", every_s=1, start_ms=now - 5_500, max_runs=2, misfire="skip")
    assert plan_fires(spent, now - 5_500, now, 2).missed == 0


async def test_sleep_follows_the_earliest_due_time(store: TaskStore) -> None:
    poller = Poller(store, PollerSettings(max_tick_s=5.0))
    keys = await store.keys()
    now = await store.now_ms()
    await store.create(TaskSpec("s", Schedule("once", at_ms=now + 300)))
    result = await poller.tick(await store.scripts(), poller.partitions(keys), get_logger())
    assert 0.1 < poller.sleep_s(result) <= 0.3


def test_the_shortest_pause_is_min_tick_s_until_a_tick_gathers_tick_fires() -> None:
    """``min_tick_s`` while a tick gathers at most TICK_FIRES (the rate measured over whole
    windows of the poller's own fires); above, shorter in proportion to the rate."""
    meter = RateMeter(window_s=1.0)
    meter.add(5_000, now=0.0)
    meter.add(5_000, now=0.5)
    assert meter.rate == 0.0  # no whole window yet: the pause stays min_tick_s
    assert shortest_pause_s(0.02, meter.rate) == 0.02
    meter.add(10_000, now=1.0)
    assert meter.rate == 20_000  # 20,000 fires in the first second
    assert shortest_pause_s(0.02, meter.rate) == TICK_FIRES / 20_000 == 0.01  # a tick's worth
    for t in (1.5, 2.0):
        meter.add(2_000, now=t)
    assert meter.rate == 4_000
    assert shortest_pause_s(0.02, meter.rate) == 0.02  # a tick of 80 fires: unchanged
    rates = range(1_000, 80_001, 1_000)
    pauses = [shortest_pause_s(0.02, r) for r in rates]
    assert max(pauses) == shortest_pause_s(0.02, 10_000) == 0.02  # where the bounds meet
    assert all(p * r <= TICK_FIRES * (1 + 1e-9) for p, r in zip(pauses, rates, strict=True))
    assert pauses == sorted(pauses, reverse=True)  # never longer at a higher rate
    assert shortest_pause_s(0.005, 20_000) == 0.005  # a shorter setting holds further up
    assert shortest_pause_s(0.0, 40_000) == shortest_pause_s(0.0, 1_000) == 0.0


async def test_a_poller_serving_a_share_of_the_partitions_pauses_for_the_whole_rate(
    store: TaskStore,
) -> None:
    """Two pollers at 20,000 fires/s pause as one would: each sees ~10,000/s of its own."""
    poller = Poller(store, PollerSettings())
    poller.membership = Membership(poller.poller_id, 16, 10_000)
    poller.membership.wanted = list(range(8))  # half of them: another poller has the rest
    poller._rate.rate = 10_000.0
    assert poller.namespace_rate() == 20_000.0
    due_soon = TickResult(enqueued=0, now_ms=0, earliest_ms=1, full=False)
    assert poller.sleep_s(due_soon) == shortest_pause_s(0.02, 20_000) == 0.01
    poller.membership.wanted = []  # more pollers than partitions: none of its own
    poller._rate.rate = 0.0
    assert poller.namespace_rate() == 0.0


def test_live_pollers_want_disjoint_partitions_covering_all() -> None:
    members = ["a", "b", "c"]
    split = [wanted_partitions(m, members, 8) for m in members]
    assert split == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert wanted_partitions("b", [], 3) == [0, 1, 2]  # alone (not listed yet): everything
    assert wanted_partitions("b", ["a"], 4) == [1, 3]  # not listed yet, counted in


async def test_pollers_share_the_partitions_and_take_over_from_one_that_stops(
    store: TaskStore,
) -> None:
    """Three pollers split four partitions, each partition owned by one; when two stop,
    the last takes their partitions at once (they were handed back), and no fire is
    missed or doubled throughout."""
    keys = await store.keys()
    start = await store.now_ms() + 100
    # fire_all: a poller that comes up or falls behind more than one interval late on a
    # loaded machine fires the grid times it is late for instead of coalescing them, so a
    # missing one is a loss.
    schedule = Schedule("interval", every_s=0.1, start_ms=start, misfire="fire_all")
    created = await store.create_many([TaskSpec("r", schedule, i) for i in range(40)])
    pollers = [Poller(store, PollerSettings(max_tick_s=0.02, claim_lease_ms=3000)) for _ in "abc"]

    async def owners() -> dict[int, str]:
        return {p: (await owner(store, p)).get("poller", "") for p in range(keys.partitions)}

    async with trio.open_nursery() as outer:
        scopes = []
        for i, poller in enumerate(pollers):
            scope = trio.CancelScope()
            scopes.append(scope)

            async def serve(
                poller: Poller = poller, scope: trio.CancelScope = scope, i: int = i
            ) -> None:
                with scope:
                    ctx = ActorContext(f"node/poller-{i}", 1.0, get_logger())
                    async with trio.open_nursery() as inner:
                        await inner.start(poller.run, ctx)

            outer.start_soon(serve)

        async def shared() -> bool:
            held = await owners()
            return set(held.values()) == {p.poller_id for p in pollers} and all(
                set(poller.owned) == {q for q, o in held.items() if o == poller.poller_id}
                for poller in pollers
            )

        await eventually(shared, poll_s=0.05)
        scopes[0].cancel()
        scopes[1].cancel()
        last = pollers[2].poller_id

        async def taken_over() -> bool:
            return set((await owners()).values()) == {last}

        await eventually(taken_over, poll_s=0.05)
        end = await store.now_ms() + 500  # a few more rounds under the last poller
        expected = {f"{t.task_id}:{due}" for t in created for due in range(start, end, 100)}

        async def all_in() -> bool:
            return expected <= {f["schedule_id"] for f in await stream_fires(store, "r")}

        await settled(all_in)  # a loaded machine's poller may run late, not lose fires
        outer.cancel_scope.cancel()
    fires = Counter(f["schedule_id"] for f in await stream_fires(store, "r"))
    assert set(fires.values()) == {1}  # no fire twice
    assert expected <= set(fires), f"missing: {sorted(expected - set(fires))[:3]}"


# -- kill -9 ------------------------------------------------------------------------------------


def poller_config(
    tmp_path: Path, redis_url: str, namespace: str, lease_ms: int = 300, name: str = "poller"
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'namespace = "{namespace}"\n'
        f'[node]\nname = "{name}"\n'
        f'[redis]\nurl = "{redis_url}"\n'
        "[scheduler]\npollers = 1\npartitions = 4\nmax_tick_s = 0.02\n"
        f"claim_lease_ms = {lease_ms}\ndedupe_window_s = {max(60, lease_ms // 500)}\n"
        "batch_size = 7\n"
    )
    return path


async def test_a_killed_nodes_partitions_are_taken_over_by_a_node_of_its_host(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """Two poller nodes split four partitions; one is SIGKILLed. Its leases last ten
    minutes, so only seeing that its process has exited lets the other take its
    partitions: it does, and every grid time still reaches the stream."""
    start = await store.now_ms() + 500
    # fire_all: a poller that falls behind its 250 ms grid on a loaded machine fires the
    # grid times it is late for instead of coalescing them, so a missing one is a loss.
    schedule = Schedule("interval", every_s=0.25, start_ms=start, misfire="fire_all")
    await store.create_many([TaskSpec("h", schedule, i) for i in range(40)])
    keys = await store.keys()
    nodes = [
        NodeProcess(poller_config(tmp_path, redis_url, namespace, 600_000, name))
        for name in ("a", "b")
    ]

    async def owners() -> list[str]:
        return [(await owner(store, p)).get("poller", "") for p in range(keys.partitions)]

    async def until(condition: Callable[[list[str]], bool]) -> None:
        with trio.move_on_after(60):
            while not condition(await owners()):  # noqa: ASYNC110 - polling Redis
                await trio.sleep(0.05)
            return
        raise AssertionError(f"partition owners now: {await owners()}")

    try:
        for node in nodes:
            await trio.to_thread.run_sync(node.wait_for, "poller_ready")
        await until(lambda held: len(set(held)) == 2 and "" not in held)  # shared
        # What is checked starts once both nodes are up.
        window_start = await store.now_ms()
        killed = nodes[0].wait_for("poller_ready")[0]["poller"]
        nodes[0].signal(signal.SIGKILL)
        await until(lambda held: killed not in held and len(set(held)) == 1)  # taken over
        window_end = await store.now_ms() + 1500  # a while of the last poller's work
        expected = {due for due in range(start, window_end, 250) if due >= window_start}
        await settled(lambda: every_grid_time(store, "h", 40, expected))
    finally:
        for node in nodes:
            await trio.to_thread.run_sync(node.kill)
    seen: dict[str, set[int]] = defaultdict(set)
    for fire in await stream_fires(store, "h"):
        seen[fire["task_id"]].add(int(fire["due_ms"]))
    assert len(seen) == 40 and len(expected) > 4
    for task_id, dues in seen.items():
        assert expected <= dues, f"{task_id} missing fires: {sorted(expected - dues)[:5]}"


async def every_grid_time(store: TaskStore, task_type: str, tasks: int, dues: set[int]) -> bool:
    """Whether each of the ``tasks`` tasks of ``task_type`` has a fire due at each of
    ``dues`` in the stream."""
    seen: dict[str, set[int]] = defaultdict(set)
    for fire in await stream_fires(store, task_type):
        seen[fire["task_id"]].add(int(fire["due_ms"]))
    return len(seen) == tasks and all(dues <= due for due in seen.values())


async def test_poller_killed_mid_batch_repeatedly_loses_no_fire(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """SIGKILL a real poller process at random moments, 8 times; every grid time up to the
    end of the run reaches the stream at least once, and duplicates share a schedule_id."""
    start = await store.now_ms() + 500
    schedule = Schedule("interval", every_s=0.25, start_ms=start, misfire="fire_all")
    await store.create_many([TaskSpec("k", schedule, i) for i in range(60)])
    config = poller_config(tmp_path, redis_url, namespace)
    rng = random.Random(7)
    kills = 0
    waited_s = 0.0  # the least time the kills took: the window below covers at least that
    for _ in range(8):
        node = NodeProcess(config)
        try:
            await trio.to_thread.run_sync(node.wait_for, "poller_ready")
            pause_s = rng.uniform(0.05, 0.5)
            waited_s += pause_s
            await trio.sleep(pause_s)
            node.signal(signal.SIGKILL)
            kills += 1
        finally:
            await trio.to_thread.run_sync(node.kill)
    final = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(final.wait_for, "poller_ready")
        window_end = await store.now_ms() + 1000  # a second of the final poller's work
        expected = set(range(start, window_end, 250))
        await settled(lambda: every_grid_time(store, "k", 60, expected))
        final.signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(final.wait) == 0
    finally:
        await trio.to_thread.run_sync(final.kill)
    assert kills == 8
    seen: dict[str, set[int]] = defaultdict(set)
    for fire in await stream_fires(store, "k"):
        assert fire["schedule_id"] == f"{fire['task_id']}:{fire['due_ms']}"
        seen[fire["task_id"]].add(int(fire["due_ms"]))
    assert len(seen) == 60
    assert len(expected) >= int((waited_s + 0.5) / 0.25)  # grid times from all eight lives
    for dues in seen.values():
        assert expected <= dues, f"missing fires: {sorted(expected - dues)[:5]}"


class FailingCommit(Scripts):
    """The real scripts, except that the first enqueue-and-commit runs the enqueue alone
    and then fails: the poller's view of a Redis that went away between its two steps."""

    failures = 1

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
        if self.failures:
            self.failures -= 1
            await self.enqueue(fires, now_ms, dedupe_window_ms, token, committed)
            raise RedisUnavailable("injected: connection lost before the commit")
        return await super().enqueue_and_commit(
            fires, now_ms, dedupe_window_ms, token, committed, poller, commits, writes
        )


async def test_a_commit_lost_after_the_enqueue_is_ridden_out_with_the_same_claim(
    one_partition: TaskStore,
) -> None:
    """Redis goes away between the enqueue and the commit: the tick waits for it and
    commits with its own claim, instead of leaving the claim to expire a lease later."""
    store = one_partition
    past = await store.now_ms() - 10
    await store.create(TaskSpec("t", Schedule("interval", every_s=60, start_ms=past), task_id="x"))
    scripts = FailingCommit(store.client, await store.keys())
    poller = Poller(store, PollerSettings(claim_lease_ms=60_000))
    with trio.fail_after(30):
        result = await poller.tick(scripts, [0], get_logger())
    assert scripts.failures == 0  # the failure struck, and was ridden out
    assert result.enqueued == 1
    assert [f["schedule_id"] for f in await stream_fires(store, "t")] == [f"x:{past}"]
    task = await store.get("x")
    assert task is not None and task.next_run_ms == past + 60_000  # committed, no lease wait


async def tasks_in_partitions(
    redis_client: RedisClient, namespace: str, partitions: int
) -> tuple[TaskStore, int, list[str]]:
    """A store of ``partitions`` partitions, with tasks due now in more than one of them
    when there are several (a tick's commits then check the markers in each)."""
    store = TaskStore(redis_client, namespace, default_partitions=partitions)
    past = await store.now_ms() - 10
    ids = [f"x{i}" for i in range(2 * partitions)]
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
    keys = await store.keys()
    assert len({keys.partition_of(i) for i in ids}) > (partitions > 1)
    return store, past, ids


async def test_without_the_dedupe_window_a_rejected_stream_is_waited_out(
    redis_client: RedisClient, namespace: str
) -> None:
    """Without markers a repeated call appends again, so nothing is sent type by type: the
    enqueue (its stream key holds a string: WRONGTYPE) is repeated with backoff, nothing
    is committed meanwhile, and the fires go once the stream can take them, each once."""
    store, past, ids = await tasks_in_partitions(redis_client, namespace, 4)
    keys = await store.keys()
    scripts = await store.scripts()
    await store.client.execute("SET", keys.queue("t"), "not a stream")
    poller = Poller(store, PollerSettings(dedupe_window_ms=0))
    results: list[TickResult] = []

    async def tick() -> None:
        results.append(await poller.tick(scripts, list(range(4)), get_logger()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await eventually(lambda: store.client.refusing == "rejected", poll_s=0.01)
        for task in await store.get_many(ids):
            assert task is not None and (task.next_run_ms, task.fires) == (past, 0)  # not moved
        await store.client.execute("DEL", keys.queue("t"))
    (result,) = results
    assert result.enqueued == len(ids)
    fired = sorted(f["schedule_id"] for f in await stream_fires(store, "t"))
    assert fired == sorted(f"{i}:{past}" for i in ids)
    for task in await store.get_many(ids):
        assert task is not None and (task.next_run_ms, task.fires) == (past + 60_000, 1)


async def test_a_held_back_task_is_said_misfired_once_when_its_stream_is_back(
    redis_client: RedisClient, namespace: str, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A task held back longer than its interval is planned again from the same grid time
    at each claim: its missed times are said (``misfired``, and counted) once, by the claim
    that fires it, not again at every hold."""
    store = TaskStore(redis_client, namespace, default_partitions=1)
    past = await store.now_ms() - 10
    ids = ["x0", "x1"]
    every = Schedule("interval", every_s=1, start_ms=past)  # misfire: coalesce
    await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
    keys = await store.keys()
    scripts = await store.scripts()
    await store.client.execute("SET", keys.queue("t"), "not a stream")
    poller = Poller(store, PollerSettings(claim_lease_ms=1000))
    held = 0

    async def held_twice() -> bool:  # claimed again (a second past its grid time) and held
        nonlocal held
        await poller.tick(scripts, [0], get_logger())
        held = len([e for e in log_lines() if e["event"] == "fires_held_back"])
        scores = [await store.client.execute("ZSCORE", keys.schedule(0), i) for i in ids]
        return all(float(score) > past + 2500 for score in scores)

    await eventually(held_twice, poll_s=0.1)
    assert held == 1
    assert [e for e in log_lines() if e["event"] == "misfired"] == []
    await store.client.execute("DEL", keys.queue("t"))

    async def fired() -> bool:
        await poller.tick(scripts, [0], get_logger())
        return len(await stream_fires(store, "t")) >= len(ids)

    await eventually(fired, poll_s=0.1)
    misfired = [e for e in log_lines() if e["event"] == "misfired"]
    assert sorted(e["task_id"] for e in misfired) == ids
    assert all(e["missed"] >= 1 and e["due_ms"] == past for e in misfired)
    assert len(await stream_fires(store, "t")) == len(ids)  # coalesced: one fire each


@pytest.mark.parametrize(("partitions", "overlap"), [
    (1, "allow_all"), (4, "allow_all"), (4, "skip"), (4, "buffer_one"),
])  # fmt: skip
async def test_a_rejected_stream_holds_back_its_own_type_only(
    redis_client: RedisClient, namespace: str, partitions: int, overlap: Overlap,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """Type ``t``'s stream key holds a string (WRONGTYPE): the tick appends and commits
    type ``u``'s fires and holds back ``t``'s tasks alone, their grid where it was and
    their score a claim lease on (so the tick returns and the next ones go on with the
    rest); claimed again once the stream takes writes, each fires once, a policy's fire
    in flight included (left to the task's next decision, whenever it comes)."""
    store = TaskStore(redis_client, namespace, default_partitions=partitions)
    past = await store.now_ms() - 10
    every = Schedule("interval", every_s=60, start_ms=past, overlap=overlap)
    held, fine = [f"x{i}" for i in range(2 * partitions)], [f"y{i}" for i in range(3)]
    await store.create_many(
        [TaskSpec("t", every, task_id=i) for i in held]
        + [TaskSpec("u", every, task_id=i) for i in fine]
    )
    keys = await store.keys()
    scripts = await store.scripts()
    await store.client.execute("SET", keys.queue("t"), "not a stream")
    lease_ms = 1500
    poller = Poller(store, PollerSettings(claim_lease_ms=lease_ms))
    everything = list(range(partitions))
    seconds, micros = await store.client.execute("TIME")
    before = int(seconds) * 1000 + int(micros) // 1000  # the scripts' clock
    with trio.fail_after(30):  # it used to wait for the stream, every type with it
        result = await poller.tick(scripts, everything, get_logger())
    assert result.enqueued == len(fine)
    assert sorted(f["schedule_id"] for f in await stream_fires(store, "u")) == sorted(
        f"{i}:{past}" for i in fine
    )
    for task in await store.get_many(fine):
        assert task is not None and (task.next_run_ms, task.fires) == (past + 60_000, 1)
    for task_id in held:
        task = await store.get(task_id)
        assert task is not None and (task.next_run_ms, task.fires) == (past, 0)  # not moved
        score = await store.client.execute(
            "ZSCORE", keys.schedule(keys.partition_of(task_id)), task_id
        )
        assert float(score) >= before + lease_ms
        flight = await store.client.execute(
            "HGET", f"{keys.tag(keys.partition_of(task_id))}:flight", task_id
        )
        if overlap != "allow_all":  # in flight, its decider's time dropped: no one waits on it
            assert flight is not None and "@" not in flight.decode().split("|")[4]
    (line,) = [e for e in log_lines() if e["event"] == "fires_held_back"]
    assert line["type"] == "t" and "WRONGTYPE" in line["error"]
    # Held: the next ticks claim nothing of them, and nothing of u is due.
    assert (await poller.tick(scripts, everything, get_logger())).enqueued == 0
    await store.client.execute("DEL", keys.queue("t"))
    appended: list[int] = []

    async def fired_once_each() -> bool:
        appended.append((await poller.tick(scripts, everything, get_logger())).enqueued)
        return len(await stream_fires(store, "t")) >= len(held)

    await eventually(fired_once_each, poll_s=0.1)
    assert sum(appended) == len(held)
    assert sorted(f["schedule_id"] for f in await stream_fires(store, "t")) == sorted(
        f"{i}:{past}" for i in held
    )
    for task in await store.get_many(held):
        assert task is not None and (task.next_run_ms, task.fires) == (past + 60_000, 1)
    assert [e["type"] for e in log_lines() if e["event"] == "fires_resumed"] == ["t"]
    assert [e for e in log_lines() if e["event"] == "fires_held_back"] == [line]


@pytest.mark.parametrize("partitions", [1, 4])
async def test_a_commit_run_ahead_of_its_reloaded_enqueue_is_sent_again(
    redis_client: RedisClient, namespace: str, partitions: int
) -> None:
    """Redis lost the enqueue script but not the commit's (a flush, then only the commit
    loaded again): in the pipeline the commit runs, finds no marker and changes nothing; the
    enqueue is loaded and sent again, and then the commit is sent again after it."""
    store, past, ids = await tasks_in_partitions(redis_client, namespace, partitions)
    scripts = await store.scripts()
    poller = Poller(store, PollerSettings())
    claims = await scripts.claim_due(range(partitions), poller.poller_id, "tok-1", 100, 10_000)
    tasks = [(c.partition, t) for c in claims for t in c.tasks]
    await store.client.execute("SCRIPT", "FLUSH")
    await store.client.execute("SCRIPT", "LOAD", lua.COMMIT_FIRES.source)
    commits: dict[int, list[FireCommit]] = defaultdict(list)
    for p, task in tasks:
        commits[p].append(fire_commit(task, past + 60_000, past + 60_000, 1))
    now = claims[0].now_ms
    flags, done, aside = await scripts.enqueue_and_commit(
        [Fire(t.task_id, "t", t.payload, past, prior=t.prior_claim) for _, t in tasks], now,
        60_000, "tok-1", None, poller.poller_id, commits, {c.partition: c.writes for c in claims},
    )  # fmt: skip
    assert flags == [True] * len(ids) and aside == []
    assert all(d.lost == [] and d.earliest_ms == past + 60_000 for d in done.values())
    fired = sorted(f["schedule_id"] for f in await stream_fires(store, "t"))
    assert fired == sorted(f"{i}:{past}" for i in ids)
    for stored in await store.get_many(ids):
        assert stored is not None and (stored.next_run_ms, stored.fires) == (past + 60_000, 1)


def test_the_lag_budget_caps_the_pause_whatever_the_rate() -> None:
    assert paced_pause_s(0.02, 0.01, 100) == 0.01  # the budget holds below the batching rate
    assert paced_pause_s(0.005, 0.01, 100) == 0.005  # a shorter pause holds too
    assert paced_pause_s(0.02, 0.01, 40_000) == TICK_FIRES / 40_000  # a tick's worth
    assert paced_pause_s(0.02, 0.05, 1_000) == 0.02  # a larger budget lets min_tick_s hold
    assert paced_pause_s(0.02, 0.0, 1_000) == 0.0
