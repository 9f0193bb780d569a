"""A poller's committed states (``actors.store.known_states``): once its claims find every
due task known, they read no state record, and every write that is not the poller's own
commit (an API write, a takeover by another poller, a migration) makes the next claim read
the states again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.scheduling import poller as scheduling
from actors.store.claim_replies import LeanClaim, add_read_definitions
from actors.store.definitions import DefinitionCache
from actors.store.known_states import KnownStates
from actors.store.messages import Message
from actors.store.records import encode_definition, encode_schedule, encode_state
from actors.store.replies import Claimed, PartitionClaim, fire_commit
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import RedisProcess
from tests.waiting import eventually

_tokens = iter(range(1, 10**9))
EVERY_MINUTE = Schedule("interval", every_s=60, start_ms=0)


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=1)


class Poller:
    """What a poller keeps between ticks, and a tick of partition 0 whose commit leaves
    each grid where it was (so the tasks stay due) with ``fired`` fires counted."""

    def __init__(self, store: TaskStore, name: str = "A") -> None:
        self.store = store
        self.name = name
        self.definitions = DefinitionCache(100)
        self.states = KnownStates(100)

    async def claim(self, limit: int = 100) -> tuple[str, PartitionClaim]:
        scripts = await self.store.scripts()
        token = f"{self.name}-{next(_tokens)}"
        (claim,) = await scripts.claim_due(
            [0], self.name, token, limit, 60_000, definitions=self.definitions, states=self.states
        )
        return token, claim

    async def tick(self, fired: int = 1, limit: int = 100) -> dict[str, Claimed]:
        token, claim = await self.claim(limit)
        commits = [fire_commit(t, t.due_ms, t.due_ms, fired) for t in claim.tasks]
        scripts = await self.store.scripts()
        done = await scripts.commit_fires(self.name, token, {0: commits}, {0: claim.writes})
        assert not done[0].lost
        self.states.committed(0, claim.writes, commits)
        return {t.task_id: t for t in claim.tasks}


async def rewrite_state_behind_the_api(store: TaskStore, task_id: str, fires: int) -> None:
    """The stored state changed without a write counted (a hand edit)."""
    keys = await store.keys()
    task = await store.get(task_id)
    assert task is not None and task.next_run_ms is not None
    raw = encode_state("active", task.next_run_ms, fires, task.updated_ms, 0, 0, None, None)
    await store.client.execute("HSET", keys.states(0, keys.bucket_of(task_id)), task_id, raw)


async def due_tasks(store: TaskStore, *ids: str) -> None:
    past = await store.now_ms() - 100_000
    every = Schedule("interval", every_s=60, start_ms=past)
    await store.create_many([TaskSpec("t", every, {"id": i}, task_id=i) for i in ids])


async def test_claims_read_no_state_once_every_due_task_is_known(store: TaskStore) -> None:
    await due_tasks(store, "a", "b")
    poller = Poller(store)
    first = await poller.tick()  # states read; committed ones kept
    assert {t: c.fires for t, c in first.items()} == {"a": 0, "b": 0}
    second = await poller.tick()  # read again: the first claim did not know them yet
    assert {t: c.fires for t, c in second.items()} == {"a": 1, "b": 1}
    await rewrite_state_behind_the_api(store, "a", fires=40)
    third = await poller.tick()  # known: the hand edit is not read
    assert {t: c.fires for t, c in third.items()} == {"a": 2, "b": 2}
    fresh = await Poller(store).claim()  # a poller that knows nothing reads the stored ones
    assert {t.task_id: t.fires for t in fresh[1].tasks} == {"a": 3, "b": 3}


async def test_an_api_write_makes_the_next_claim_read_the_states(store: TaskStore) -> None:
    await due_tasks(store, "a", "b", "c")
    poller = Poller(store)
    await poller.tick()
    await poller.tick()
    await rewrite_state_behind_the_api(store, "a", fires=40)
    await store.update("b", payload={"id": "b", "v": 2})  # an API write to another task
    assert await store.pause("c")
    after = await poller.tick()
    assert set(after) == {"a", "b"}  # c paused: not claimed
    assert after["a"].fires == 40  # read again: every state, not only the written one
    assert after["b"].updated_ms == (await store.get("b")).updated_ms  # type: ignore[union-attr]
    assert json.loads(after["b"].payload) == {"id": "b", "v": 2}


async def test_a_partition_taken_over_and_back_is_read_again(store: TaskStore) -> None:
    """Another poller's commits may leave a task's score as it was (here: the grid kept,
    its fires counted), and the claim that takes the partition back may not reach every
    task: the takeovers' count tells the first poller that what it knew may be old."""
    await due_tasks(store, "a", "b")
    a, b = Poller(store, "A"), Poller(store, "B")
    await a.tick()
    await a.tick()  # A knows both states now (2 fires each)
    scripts = await store.scripts()
    assert await scripts.release_partitions([0], "A") == [0]
    assert {t: c.fires for t, c in (await b.tick(fired=5)).items()} == {"a": 2, "b": 2}
    assert await scripts.release_partitions([0], "B") == [0]
    assert set(await a.tick(limit=1)) == {"a"}  # taken back: one task read, and committed
    assert {t: c.fires for t, c in (await a.tick()).items()} == {"a": 8, "b": 7}


async def test_a_task_the_poller_does_not_know_is_read_in_a_second_call(
    store: TaskStore,
) -> None:
    """Claimed without its state (the partition's states known, this task's not kept):
    read next with its definition."""
    await due_tasks(store, "a", "b")
    poller = Poller(store)
    await poller.tick()
    await poller.tick()
    poller.states.discard(0, "b")  # as a full cache would not have kept it
    claimed = await poller.tick()
    assert {t: c.fires for t, c in claimed.items()} == {"a": 2, "b": 2}


def test_a_state_read_after_a_claim_that_left_it_out_is_taken_only_if_unchanged() -> None:
    definition = encode_definition("t", "{}", encode_schedule(EVERY_MINUTE), 1000)
    active = encode_state("active", 5000, 3, 1000, 0, 0, None, None)
    paused = encode_state("paused", 5000, 3, 1000, 0, 0, None, None)

    def read(reply: list[object], writes: int = 7) -> list[Claimed]:
        claim = PartitionClaim(0, 6000, 5000, [], writes=writes)
        lean = LeanClaim(claim, [("a", 3, None)], -1, "")
        add_read_definitions(lean, reply)
        return lean.claim.tasks

    assert read([definition, active, b"8"]) == []  # a write came between: next tick
    assert read([definition, paused, b"7"]) == []  # not active: not claimed
    assert read([None, None, b"7"]) == []  # deleted
    (task,) = read([definition, active, b"7"])
    assert (task.task_id, task.bucket, task.due_ms, task.fires) == ("a", 3, 5000, 3)


def test_what_is_kept_stays_within_its_limit_and_goes_with_the_count() -> None:
    state: list[object] = [0, 5000, 1, 1000, 0, None, None, None, None]
    states = KnownStates(2)
    states.claimed(0, 4)

    def commit(*ids: str, score: int | None = 5000) -> None:
        commits = []
        for task_id in ids:
            c = fire_commit(_claimed(task_id, state), score, score, 0)
            commits.append(c)
        states.committed(0, 4, commits)

    commit("a", "b", "c")
    assert len(states) == 2 and states.get(0, "c", 5000) is None
    assert states.get(0, "a", 5000) is not None and states.get(0, "a", 5001) is None
    commit("a", score=None)  # finished: out of the schedule, and out of here
    assert len(states) == 1 and "a" not in states.of(0)
    states.claimed(0, 5)  # the count moved: nothing is known any more
    assert len(states) == 0 and states.writes_to_ask(0) is None


def _claimed(task_id: str, values: list[object]) -> Claimed:
    return Claimed(task_id, 0, "t", b"{}", EVERY_MINUTE, 5000, 1, 1000, state=list(values))


# redis-py can drop a socket it opened while the server was coming back (inside its own
# reconnect check) without closing it; that is its leak, not a hang or a lost call.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_redis_back_without_its_last_writes_loses_no_fire(tmp_path: Path) -> None:
    """Redis killed and started again from a snapshot taken seconds before: the fires
    enqueued after the snapshot are gone with it, and the grids are back where the
    snapshot had them (the count of writes too). The poller must not go on from the states
    it committed since (their scores are not the stored ones): every grid time from the
    snapshot's on reaches the stream again, as Redis's data says."""
    server = RedisProcess(find_server_binary()).start()
    client = RedisClient.from_settings(
        server.url, RedisSection(url=server.url, connect_timeout_s=0.3, socket_timeout_s=0.5)
    )
    try:
        store = TaskStore(client, "rollback", default_partitions=1)
        start = await store.now_ms() - 500
        every = Schedule("interval", every_s=1, start_ms=start, misfire="fire_all")
        ids = [f"t{i}" for i in range(5)]
        await store.create_many([TaskSpec("t", every, task_id=i) for i in ids])
        keys = await store.keys()

        async def fires() -> dict[str, list[int]]:
            entries = await client.execute("XRANGE", keys.queue("t"), "-", "+")
            out: dict[str, list[int]] = {i: [] for i in ids}
            for entry_id, fields in entries:
                message = Message.decode(entry_id, fields, "t")
                out[message.task_id].append(message.due_ms)
            return out

        async def marked() -> int:
            return int(await client.execute("EXISTS", "written-after-the-snapshot"))

        async def until(enough: Callable[[dict[str, list[int]]], bool]) -> None:
            async def holds() -> bool:
                return enough(await client.ride_out(fires))

            await eventually(holds, 60, poll_s=0.05)

        poller = scheduling.Poller(store, scheduling.PollerSettings())
        ctx = ActorContext("node/poller", 1.0, get_logger(actor="node/poller"))
        async with trio.open_nursery() as nursery:
            await nursery.start(poller.run, ctx)
            await until(lambda f: all(len(d) >= 2 for d in f.values()))
            saved = await fires()  # read first: what is appended before SAVE only adds to the end
            await client.execute("SAVE")
            await client.execute("SET", "written-after-the-snapshot", "1")
            await until(lambda f: all(len(f[i]) >= len(saved[i]) + 3 for i in ids))
            server.kill()
            await trio.to_thread.run_sync(server.start, server.port)
            # The snapshot's data, and nothing written after it (the poller, reconnected
            # already, may have appended the snapshot's next grid times again).
            assert await client.ride_out(marked) == 0
            back = await client.ride_out(fires)
            assert all(back[i][: len(saved[i])] == saved[i] for i in ids), (back, saved)
            back_ms = await store.now_ms()
            await until(lambda f: all(max(d) >= back_ms + 1000 for d in f.values()))
            nursery.cancel_scope.cancel()
        for task_id, dues in (await fires()).items():
            grid = sorted(set(dues))
            assert grid == list(range(start, grid[-1] + 1, 1000)), task_id  # none skipped
    finally:
        await client.aclose()
        server.remove()


async def test_a_running_poller_claims_without_reading_the_states_it_committed(
    store: TaskStore,
) -> None:
    """The node's poller keeps what it committed: a state hand-edited under it (no write
    counted) is not read back, its own count of fires goes on (API writes are read:
    ``test_an_api_write_makes_the_next_claim_read_the_states``)."""
    start = await store.now_ms()
    every = Schedule("interval", every_s=0.2, start_ms=start)
    await store.create(TaskSpec("t", every, {"v": 1}, task_id="a"))
    poller = scheduling.Poller(store, scheduling.PollerSettings())
    ctx = ActorContext("node/poller", 1.0, get_logger(actor="node/poller"))

    async def fires() -> int:
        task = await store.get("a")
        assert task is not None
        return task.fires

    async def until_fires(low: int, high: int = 10**9) -> None:
        async def within() -> bool:
            return low <= await fires() < high

        await eventually(within, 60)

    async with trio.open_nursery() as nursery:
        await nursery.start(poller.run, ctx)
        await until_fires(4)  # two claims read the state; the next ones need not
        before = await fires()
        await rewrite_state_behind_the_api(store, "a", fires=1000)
        await until_fires(before + 3, 1000)  # its own count goes on, the edit overwritten
        nursery.cancel_scope.cancel()
