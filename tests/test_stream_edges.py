"""The consumer's edges against a real Redis: repeated calls after a lost reply, poison
from compact messages, replays within a dedupe window, what a consumer holds in its
mailbox, and messages pending under its own name that it never saw."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_util

from actors.config import ConsumerSection
from actors.execution import leases
from actors.execution.claimer import Claimer, ClaimerSettings
from actors.execution.consumer import ConsumerState
from actors.execution.flight import Flight
from actors.execution.identity import Identity
from actors.execution.leases import RELEASED_IDLE_MS
from actors.execution.reading import Reader
from actors.store.keys import GROUP, Keys
from actors.store.messages import Message
from actors.store.replies import DeadLetterWrite
from actors.store.scripts import Scripts
from actors.store.streams import Streams
from actors.store.tasks import TaskStore
from runtime.channels import Mailbox
from runtime.config import RedisSection
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from tests.execution_harness import node_config, records, running_node, wait_until


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(namespace, 4, compact_messages=True)


@pytest.fixture
def scripts(redis_client: RedisClient, keys: Keys) -> Scripts:
    return Scripts(redis_client, keys)


async def compact_messages(client: RedisClient, keys: Keys, count: int) -> list[str]:
    """``count`` messages in the compact form (task_id, payload, attempt, due_ms)."""
    stream = keys.queue("t")
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    return [
        (
            await client.execute(
                "XADD", stream, "*", "task_id", f"x{i}", "payload", "{}", "attempt", "0",
                "due_ms", "7",
            )
        ).decode()
        for i in range(count)
    ]  # fmt: skip


async def read_as(client: RedisClient, keys: Keys, consumer: str, count: int = 100) -> None:
    await client.execute(
        "XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "STREAMS", keys.queue("t"), ">"
    )


async def pending(client: RedisClient, keys: Keys) -> dict[str, tuple[str, int, int]]:
    """id -> (owner, idle ms, deliveries)."""
    raw = client.raw
    rows = await client.run_sync(lambda: raw.xpending_range(keys.queue("t"), GROUP, "-", "+", 100))
    return {
        _text(r["message_id"]): (
            _text(r["consumer"]),
            int(r["time_since_delivered"]),
            int(r["times_delivered"]),
        )
        for r in rows
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def set_idle(client: RedisClient, keys: Keys, owner: str, ids: list[str]) -> None:
    """Make pending messages look abandoned (idle far past any lease)."""
    raw = client.raw
    await client.run_sync(
        lambda: raw.xclaim(keys.queue("t"), GROUP, owner, 0, ids, idle=10**9, justid=True)
    )


async def abandoned_pair(
    client: RedisClient, namespace: str, keys: Keys
) -> tuple[list[str], TaskStore, ConsumerState]:
    """Two messages a dead consumer left pending (idle past any lease), the store, and the
    state of a live consumer ``me`` with two free slots."""
    ids = await compact_messages(client, keys, 2)
    await read_as(client, keys, "dead")
    await set_idle(client, keys, "dead", ids)
    state = ConsumerState(name="me")
    state.free.value = 2
    return ids, TaskStore(client, namespace, default_partitions=4), state


async def test_a_dead_letter_sent_again_after_a_lost_reply_is_written_once(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    (msg,) = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "c")
    entry = DeadLetterWrite(msg, {"task_id": "x0", "reason": "failed"})
    first = await scripts.dead_letter("t", [entry])
    again = await scripts.dead_letter("t", [entry])  # the same call, its reply lost
    assert first[0] and again == [""]
    assert await redis_client.execute("XLEN", keys.dlq("t")) == 1


async def test_recover_keeps_delivery_counts_and_leaves_fresh_entries(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """Taking back its own entries is not a delivery (poison is counted in deliveries);
    with a minimum idle time, what was just read or renewed stays where it is."""
    ids = await compact_messages(redis_client, keys, 2)
    await read_as(redis_client, keys, "c")
    await set_idle(redis_client, keys, "c", [ids[0]])
    taken = await scripts.recover("t", "c", 10, min_idle_ms=60_000)
    assert [r.msg_id for r in taken] == [ids[0]]
    assert (await pending(redis_client, keys))[ids[0]][2] == 1  # still one delivery
    assert len(await scripts.recover("t", "c", 10)) == 2  # no minimum: all of them
    assert {d for _, _, d in (await pending(redis_client, keys)).values()} == {1}


async def test_a_start_counts_what_a_dead_incarnation_held_not_what_it_released(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """At a consumer's start, each entry its name's earlier incarnation died holding is a
    delivery more, or, delivered ``max_deliveries`` - 2 times already, a suspect counted
    once as it starts alone (``count_delivery``, as the consumer does, here twice as after
    a lost reply); one delivered ``max_deliveries`` times is left to the claimer as poison
    (under ``<name>/poison``); entries it released as it stopped (a deploy) are taken back
    as they are, however many restarts."""
    held, released = await compact_messages(redis_client, keys, 2)
    await read_as(redis_client, keys, "c")
    alone = []
    for _ in range(5):  # five restarts, each after a stop that released one of the two
        await redis_client.execute_unparsed(  # as release.lua hands it back
            "XCLAIM", keys.queue("t"), GROUP, "c", 0, released, "IDLE", RELEASED_IDLE_MS, "JUSTID"
        )
        taken = {r.msg_id: r for r in await scripts.recover("t", "c", 10, max_deliveries=5)}
        assert not taken[released].alone
        if held not in taken:
            break
        alone.append(taken[held].alone)
        if taken[held].alone:
            counted = taken[held].deliveries + 1
            for _ in range(2):
                assert await scripts.count_delivery("t", "c", held, counted - 1) == counted
    assert alone == [False, False, True, True]
    rows = await pending(redis_client, keys)
    assert rows[released] == ("c", rows[released][1], 1)  # never counted
    assert (rows[held][0], rows[held][2]) == ("c/poison", 5)  # 1 read + 4 restarts, then left
    assert rows[held][1] > 3_600_000  # idle past any lease: the claimer takes it at once


async def test_a_message_a_stop_released_keeps_its_count_when_another_node_takes_it_over(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A message delivered twice, then released by a stopping consumer (release.lua), is
    taken over by another node's claimer with its count as it was, and is not poison at
    ``max_deliveries`` 2: a release is not a death (a rolling deploy counts nothing). One
    idle as long but never released (its holder died) is counted and is poison."""
    released, died = await compact_messages(redis_client, keys, 2)
    await read_as(redis_client, keys, "a")
    for msg in (released, died):
        await redis_client.execute("XCLAIM", keys.queue("t"), GROUP, "b", 0, msg)  # count 2
    await redis_client.execute_unparsed(  # as release.lua hands it back
        "XCLAIM", keys.queue("t"), GROUP, "b", 0, released, "IDLE", RELEASED_IDLE_MS, "JUSTID"
    )
    await set_idle(redis_client, keys, "b", [died])
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 2, "n1")
    assert [(r.msg_id, r.deliveries) for r in reclaim.claimed] == [(released, 2)]
    assert reclaim.poisoned == [died]
    rows = await pending(redis_client, keys)
    assert (rows[released][0], rows[released][2]) == ("me", 2)


async def test_poison_of_a_compact_message_is_a_full_dead_letter_that_replays(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    (msg,) = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "dead-1")
    for owner in ("dead-2", "dead-3"):
        await redis_client.execute("XCLAIM", keys.queue("t"), GROUP, owner, 0, msg)
    await set_idle(redis_client, keys, "dead-3", [msg])
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")
    assert reclaim.poisoned == [msg] and reclaim.claimed == []
    ((dlq_id, fields),) = await redis_client.execute("XRANGE", keys.dlq("t"), "-", "+")
    assert fields[b"schedule_id"] == b"x0:7"
    assert fields[b"type"] == b"t"
    assert fields[b"enq_ms"] == msg.split("-")[0].encode()
    assert fields[b"reason"] == b"poison"
    ((new_id, task_id),) = await scripts.replay_dead("t", [dlq_id.decode()])
    assert task_id == "x0" and new_id not in ("missing", "malformed")
    replayed = await redis_client.execute("XRANGE", keys.queue("t"), new_id, new_id)
    message = Message.decode(new_id, replayed[0][1], "t")
    assert (message.schedule_id, message.attempt, message.due_ms) == ("x0:7", 0, 7)


async def test_a_compact_dead_letter_written_before_is_replayed_too(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """Dead letters that kept only the compact fields (no schedule_id, no type) replay."""
    dlq_id = await redis_client.execute(
        "XADD", keys.dlq("t"), "*", "task_id", "x9", "payload", "{}", "attempt", "0",
        "due_ms", "9", "reason", "poison",
    )  # fmt: skip
    ((new_id, _),) = await scripts.replay_dead("t", [dlq_id.decode()])
    assert new_id not in ("missing", "malformed")


async def test_a_replayed_fire_runs_even_within_the_dedupe_window(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """The fire's earlier attempts were marked started (begin_runs.lua); its replay keeps
    its schedule_id and starts at attempt 0 again, and must not be dropped as a duplicate."""
    (msg,) = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "c")
    raw = await redis_client.execute("XRANGE", keys.queue("t"), msg, msg)
    original = Message.decode(msg, raw[0][1], "t")
    assert await scripts.begin_runs("t", [original], 60_000) == [True]
    entry = DeadLetterWrite(msg, {**original.fields(), "attempts": "1", "reason": "failed"})
    (dlq_id,) = await scripts.dead_letter("t", [entry])
    ((new_id, _),) = await scripts.replay_dead("t", [dlq_id])
    await read_as(redis_client, keys, "c")
    raw = await redis_client.execute("XRANGE", keys.queue("t"), new_id, new_id)
    replay = Message.decode(new_id, raw[0][1], "t")
    assert replay.fire_key == original.fire_key
    assert await scripts.begin_runs("t", [replay], 60_000) == [True]


async def test_reclaim_looks_past_this_consumers_own_idle_entries(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    ids = await compact_messages(redis_client, keys, 4)
    await read_as(redis_client, keys, "me", 3)
    await read_as(redis_client, keys, "dead", 1)
    await set_idle(redis_client, keys, "me", ids[:3])
    await set_idle(redis_client, keys, "dead", ids[3:])
    reclaim = await scripts.reclaim("t", "me", 1000, 1, 5, "n1")
    assert [r.msg_id for r in reclaim.claimed] == [ids[3]]


async def test_a_reclaim_that_redis_ran_late_takes_nothing(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A call held up by a pause or stall finds every message idle, the live holders'
    included (their renewals were held up too): it takes nothing."""
    ids = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "busy")
    await set_idle(redis_client, keys, "busy", ids)
    now_ms = await redis_client.time_ms()
    late = await scripts.reclaim("t", "me", 1000, 10, 5, "n1", sent_ms=now_ms - 5000,
                                 max_delay_ms=1000)  # fmt: skip
    assert late.stalled and late.claimed == []
    assert (await pending(redis_client, keys))[ids[0]][0] == "busy"
    on_time = await scripts.reclaim("t", "me", 1000, 10, 5, "n1", sent_ms=now_ms,
                                    max_delay_ms=60_000)  # fmt: skip
    assert not on_time.stalled and [r.msg_id for r in on_time.claimed] == ids


async def test_messages_waiting_in_the_mailbox_keep_their_lease(
    redis_client: RedisClient, namespace: str, keys: Keys, scripts: Scripts
) -> None:
    """The claimer took messages over for a consumer whose slots then filled: they wait in
    its mailbox, pending under its name. Their leases are renewed with those in flight, so
    another node's claimer does not take them (the fire would run twice)."""
    ids, store, state = await abandoned_pair(redis_client, namespace, keys)
    inbox: Mailbox[Message] = Mailbox.open(10)
    lease_s = 1.5
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(lease_s=lease_s))
    assert await claimer.tick(scripts) == 2
    assert set(state.held) == set(ids)
    identity = Identity("me", "host:1:token", stable=True)
    stolen: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            leases.renew_forever, scripts, "t", identity, Flight(), state.held, lease_s,
            lambda holder: None,
        )  # fmt: skip
        for _ in range(10):  # a thief with the same lease, for three leases
            await trio.sleep(lease_s / 5)
            stolen += (
                await scripts.reclaim("t", "thief", int(lease_s * 1000), 10, 5, "n2")
            ).claimed
        nursery.cancel_scope.cancel()
    assert stolen == []
    assert {owner for owner, _, _ in (await pending(redis_client, keys)).values()} == {"me"}


async def test_a_recovery_after_a_failed_read_leaves_mailbox_messages_to_the_mailbox(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """After a read that failed, the reader takes back what is pending under its name and
    not running; a message the claimer handed over and that waits in the mailbox is
    pending under the name too, and must start once: from the mailbox, not also here."""
    ids = await compact_messages(redis_client, keys, 2)
    await read_as(redis_client, keys, "me")  # the lost read's delivery, and the mailbox's
    state = ConsumerState(name="me")
    raw = await redis_client.execute("XRANGE", keys.queue("t"), ids[0], ids[0])
    state.held[ids[0]] = Message.decode(ids[0], raw[0][1], "t")
    reader = Reader(
        scripts, Streams(redis_client, keys), "t", "n1", Flight(), state, lambda _: None,
        block_ms=100, dedupe_window_ms=0, actor="test",
    )  # fmt: skip
    messages, malformed = await reader._unseen("me")
    assert [m.msg_id for m in messages] == [ids[1]] and malformed == []


async def test_a_message_read_under_our_name_but_never_seen_still_runs(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """A read whose reply was lost without an error reaching the reader (a client that
    retries internally) leaves a message pending under the consumer's own name: its own
    claimer skips it, and no other node may exist. The consumer takes it back itself."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=1)
    config = node_config(redis_url, namespace, tmp_path, {"t": section}, pollers=0)
    stream = (await store.keys()).queue("t")
    raw = redis_client.raw

    def lost_read() -> Any:
        """Appended and read under the node's name in one transaction: the node's own
        blocked read never gets it."""
        pipe = raw.pipeline(transaction=True)
        pipe.xadd(stream, {"task_id": "lost", "payload": "{}", "attempt": "0", "due_ms": "5"})
        pipe.xreadgroup(GROUP, "n1", {stream: ">"}, count=10)
        return pipe.execute()[1]

    async with running_node(config):
        await wait_until(lambda: _group_exists(redis_client, stream))
        assert await redis_client.run_sync(lost_read)  # delivered to "n1", reply dropped
        await wait_until(lambda: _true(any(r["task_id"] == "lost" for r in records(record))), 30)
    assert [r["task_id"] for r in records(record)] == ["lost"]
    recovered = [e for e in log_lines() if e["event"] == "recovered"]
    assert [e["task_id"] for e in recovered] == ["lost"]


async def _group_exists(client: RedisClient, stream: str) -> bool:
    return bool(await client.execute("EXISTS", stream))


async def _true(value: bool) -> bool:
    return value


async def test_a_slot_taken_while_the_reader_woke_is_not_read_for(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """The reader waits for a free slot with the mailbox's and the recovered messages'
    readers; woken together, another may take the slot before the reader runs. The reader
    then reads nothing: Redis takes ``COUNT 0`` for no limit, and the whole backlog would
    be this consumer's, held and renewed while its slots are full."""
    await compact_messages(redis_client, keys, 20)
    state = ConsumerState(name="me")
    state.free.value = 0

    def start(messages: list[Message]) -> None:  # as the handler pool takes its slots
        state.free.value -= len(messages)

    reader = Reader(
        scripts, Streams(redis_client, keys), "t", "n1", Flight(), state, start,
        block_ms=100, dedupe_window_ms=0, actor="test",
    )  # fmt: skip
    stopping = trio_util.AsyncBool(False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.read_stream, "me", stopping)
        await trio.sleep(0.2)
        state.free.value = 1  # the reader is woken...
        state.free.value = 0  # ...and the slot taken before it runs
        await trio.sleep(0.5)
        assert await pending(redis_client, keys) == {}
        state.free.value = 1
        await wait_until(lambda: _true(bool(state.free.value == 0)))
        await trio.sleep(0.3)
        stopping.value = True
        nursery.cancel_scope.cancel()
    assert len(await pending(redis_client, keys)) == 1


async def test_a_consumer_whose_name_was_taken_starts_anew_without_releasing(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    """A consumer unrenewed for longer than its lease (stalled, cut off from Redis) may find
    its stable name taken by another live consumer, which took back what was pending
    under it. It stops without releasing those entries (they are the other's now) and
    starts again under a name of its own, instead of sharing the name for ever."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=1)
    config = node_config(redis_url, namespace, tmp_path, {"t": section}, pollers=0)

    def ready() -> list[str]:
        return [e["consumer"] for e in log_lines() if e["event"] == "consumer_ready"]

    async with running_node(config):
        await wait_until(lambda: _true(bool(ready())))
        owner = (await store.keys()).owner("t", ready()[0])
        await redis_client.execute("SET", owner, "elsewhere:1:x:y", "PX", 60_000)
        await wait_until(lambda: _true(len(ready()) >= 2), 30)
    first, second = ready()[:2]
    lines = log_lines()
    lost = [(e["consumer"], e["holder"]) for e in lines if e["event"] == "consumer_name_lost"]
    assert lost == [(first, "elsewhere:1:x:y")] and second != first
    assert [e for e in lines if e["event"] == "consumer_stopped" and e["consumer"] == first] == []
    assert [e for e in lines if e["event"] == "actor_crashed"] == []  # an exit, one line said


async def test_a_hand_over_cut_off_is_sent_by_the_next_tick(
    redis_client: RedisClient, namespace: str, keys: Keys, scripts: Scripts
) -> None:
    """A tick that took messages over for the consumer (held: renewed from then on) and
    was cut off or failed before they reached its mailbox sends them first thing next
    tick: held and never sent, they would be renewed for ever and never run."""
    ids, store, state = await abandoned_pair(redis_client, namespace, keys)
    inbox: Mailbox[Message] = Mailbox.open(1)
    raw = await redis_client.execute("XRANGE", keys.queue("t"), ids[0], ids[0])
    inbox.send.send_nowait(Message.decode(ids[0], raw[0][1], "t"))  # full: the send waits
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(lease_s=1.0))
    with trio.move_on_after(0.5) as cut:
        await claimer.tick(scripts)
    assert cut.cancelled_caught and set(state.held) == set(ids)
    inbox.receive.receive_nowait()  # the consumer takes what filled it
    got: list[Message] = []
    with trio.move_on_after(30):  # generous: the hand-over is one local step
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claimer.tick, scripts)
            got += [await inbox.receive.receive() for _ in ids]
    assert {m.msg_id for m in got} == set(ids)


async def test_a_consumer_winding_down_is_given_nothing_more(
    redis_client: RedisClient, namespace: str, keys: Keys, scripts: Scripts
) -> None:
    """A consumer that stopped reading (its node stopping) while its handlers finish still
    has free slots and its name: the claimer takes nothing over for it, which would wait
    unread in its mailbox, one delivery more each, until released at the end (messages
    hopping between draining nodes could turn poison without ever running)."""
    _, store, state = await abandoned_pair(redis_client, namespace, keys)
    state.stopping = True
    inbox: Mailbox[Message] = Mailbox.open(10)
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(lease_s=1.0))
    assert await claimer.tick(scripts) == 0
    assert {owner for owner, _, _ in (await pending(redis_client, keys)).values()} == {"dead"}
    state.stopping = False  # the same consumer started again
    assert await claimer.tick(scripts) == 2


async def test_a_poison_dead_lettered_by_a_reclaim_whose_reply_was_lost_is_still_recorded(
    redis_client: RedisClient, namespace: str, keys: Keys, scripts: Scripts
) -> None:
    """``reclaim.lua`` dead-letters a poison message and removes it from the stream; what
    that leaves to do in its task's partition (its history's ``dead``, its flight's end)
    must not live only in the reply: lost (the connection dropped, the claimer gone), a
    later tick of the claimer does it from what the script kept in Redis."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.ledger import task_history

    store = TaskStore(redis_client, namespace, default_partitions=4)
    later = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    await store.create(TaskSpec("t", later, task_id="x0"))
    (msg,) = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "c1")
    for owner in ("c2", "c3"):
        await redis_client.execute("XCLAIM", keys.queue("t"), GROUP, owner, 0, msg)
    await set_idle(redis_client, keys, "c3", [msg])
    lost = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")  # its reply never arrives
    assert lost.poisoned == [msg] and await task_history(store, "x0") == []
    state = ConsumerState(name="me")
    state.free.value = 10
    inbox: Mailbox[Message] = Mailbox.open(10)
    claimer = Claimer(
        store, "t", state, inbox, "n1", ClaimerSettings(lease_s=1.0, max_deliveries=3)
    )
    assert await claimer.tick(scripts) == 0
    (occurrence,) = await task_history(store, "x0")
    assert occurrence.fate == "dead" and occurrence.due_ms == 7
    assert await redis_client.execute("EXISTS", keys.poison_ends("t", "me")) == 0
    await claimer.tick(scripts)  # done once: nothing recorded twice
    assert len(await task_history(store, "x0")) == 1


async def test_poison_ends_a_claimer_gone_for_good_left_are_done_by_the_one_that_prunes_it(
    redis_client: RedisClient, namespace: str, keys: Keys, scripts: Scripts
) -> None:
    """A claimer dead-lettered a poison message of a skip task and died before ending its
    flight; its name never comes back (its node replaced). The consumer that prunes the
    name takes its poison ends over and ends the flight, so the task fires again, rather
    than skip every fire for the week the ends are kept."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.flights import Planned
    from actors.store.ledger import task_history

    store = TaskStore(redis_client, namespace, default_partitions=4)
    later = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="skip"
    )
    await store.create(TaskSpec("t", later, task_id="x0"))
    p = keys.partition_of("x0")
    decided = await scripts.decide_overlaps("claim", {p: [Planned("x0", "S", [7])]})
    assert decided["x0"].run == [(7, True)]
    await scripts.confirm_flights("claim", ["x0"])  # appended: in flight until it ends
    stream = keys.queue("t")
    await redis_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    msg = (
        await redis_client.execute(
            "XADD", stream, "*", "task_id", "x0", "payload", "{}", "attempt", "0",
            "due_ms", "7", "o", "S",
        )
    ).decode()  # fmt: skip
    await read_as(redis_client, keys, "c1")
    for owner in ("c2", "c3"):
        await redis_client.execute("XCLAIM", stream, GROUP, owner, 0, msg)
    await set_idle(redis_client, keys, "c3", [msg])
    lost = await scripts.reclaim("t", "gone", 1000, 10, 3, "n1")  # then its claimer died
    assert lost.poisoned == [msg]
    await redis_client.execute("XGROUP", "CREATECONSUMER", stream, GROUP, "gone")
    state = ConsumerState(name="me")
    state.free.value = 10
    inbox: Mailbox[Message] = Mailbox.open(10)
    claimer = Claimer(
        store, "t", state, inbox, "n1", ClaimerSettings(lease_s=1.0, max_deliveries=3)
    )
    assert await claimer.tick(scripts) == 0  # its own ends: none
    blocked = await scripts.decide_overlaps("next", {p: [Planned("x0", "S", [8])]})
    assert blocked["x0"].skipped == [8]  # still in flight: skipped behind it
    assert [o for o in await task_history(store, "x0") if o.fate == "dead"] == []
    assert "gone" in await scripts.prune_consumers("t", -1, "me")  # gone a while
    await claimer.tick(scripts)
    (occurrence,) = [o for o in await task_history(store, "x0") if o.fate == "dead"]
    assert occurrence.due_ms == 7
    again = await scripts.decide_overlaps("after", {p: [Planned("x0", "S", [9])]})
    assert again["x0"].run == [(9, True)]  # its flight ended: the task fires again
    assert await redis_client.execute("EXISTS", keys.poison_ends("t", "gone")) == 0
    assert await redis_client.execute("EXISTS", keys.poison_ends("t", "me")) == 0


async def test_poison_ends_kept_as_ended_end_no_flight_again(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A poison end whose flight was ended but whose history write was rejected is kept
    as ended: the next round records it without ending its flight again (each end adds
    to the task's dead streak, and a streak counted twice pauses the task too soon)."""
    stream = keys.queue("t")
    await redis_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    msg = (await redis_client.execute(
        "XADD", stream, "*", "task_id", "x0", "payload", "{}", "attempt", "1", "due_ms", "7",
        "o", "S;mt",
    )).decode()  # fmt: skip
    await read_as(redis_client, keys, "c1")
    await set_idle(redis_client, keys, "c1", [msg])
    await scripts.reclaim("t", "me", 1000, 10, 1, "n1")
    ((partition, (done, ends, dead)),) = (await scripts.poison_ends("t", "me")).items()
    assert [e.task_id for e in ends] == ["x0"] and partition == keys.partition_of("x0")
    await scripts.poison_ends_ended("t", "me", done, dead)
    ((_, (again, no_ends, kept)),) = (await scripts.poison_ends("t", "me")).items()
    assert again == done and no_ends == []
    assert [(o.task_id, o.due_ms, o.attempt, o.origin) for o in kept] == [("x0", 7, 1, 1)]


async def test_a_blip_right_after_a_long_outage_leaves_the_claimers_wait_for_the_holders(
    redis_client: RedisClient, redis_url: str, namespace: str
) -> None:
    """A claimer takes nothing over for a lease after an outage a third of a lease long or
    more (the live holders' renewals could not get through); a short outage right after
    it (a stale pooled connection, a LOADING reply) does not end that wait: the long one
    is still the one it waits after. Two short ones alone leave no wait."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    claimer = Claimer(
        store, "t", ConsumerState(), Mailbox.open(1), "n1", ClaimerSettings(lease_s=30.0)
    )
    client = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
    try:
        assert not claimer._in_grace(client)
        client._recovered(0.05)
        assert not claimer._in_grace(client)  # short: the holders renewed meanwhile
        client._recovered(30.0)  # a failover as long as the lease
        for _ in range(200):  # then blips: every pooled connection's stale error, say
            client._recovered(0.05)
        assert claimer._in_grace(client)
    finally:
        await client.aclose()


async def test_a_stopping_consumer_whose_poison_ends_wait_stays_in_the_group(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A consumer that stops with nothing pending leaves the group, unless the poison its
    claimer dead-lettered still waits to be ended (its tasks' flights, their histories):
    the pruner takes a gone consumer's ends over only while it is in the group, so
    leaving it would leave those flights in flight for good."""
    await compact_messages(redis_client, keys, 1)
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "waits")
    await redis_client.execute("XGROUP", "CREATECONSUMER", keys.queue("t"), GROUP, "done")
    await redis_client.execute("HSET", keys.poison_ends("t", "waits"), "1-1", "x")
    assert await scripts.release("t", "waits", RELEASED_IDLE_MS) == ([], False)
    assert await scripts.release("t", "done", RELEASED_IDLE_MS) == ([], True)
    raw = redis_client.raw
    names = await redis_client.run_sync(lambda: raw.xinfo_consumers(keys.queue("t"), GROUP))
    assert [_text(n["name"]) for n in names] == ["waits"]


@pytest.mark.parametrize(("stopping", "counted"), [(True, 1), (False, 2)])
async def test_what_a_failed_consumer_hands_back_counts_as_a_delivery(
    redis_client: RedisClient, keys: Keys, scripts: Scripts, stopping: bool, counted: int
) -> None:
    """A consumer asked to stop hands its messages back uncounted (a deploy is not a
    death); one that failed (an exception, or a handler's Ctrl-C unwinding it) hands them
    back counted, so a message that keeps failing its consumers, node after node, still
    reaches ``max_deliveries`` and becomes poison."""
    (msg,) = await compact_messages(redis_client, keys, 1)
    await read_as(redis_client, keys, "c")
    identity = Identity("c", "host:1:token", stable=True)
    log = get_logger()
    await leases.release(scripts, "t", identity, Flight(), "a", log, stopping=stopping)
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 5, "n1")
    assert [(r.msg_id, r.deliveries) for r in reclaim.claimed] == [(msg, counted)]


async def _cancel_other_messages(client: RedisClient, keys: Keys) -> list[str]:
    """Two ``cancel_other`` messages (policy code ``C``: tasks c0 and c1, due 7) with a
    cancel request each, and one request for a fire no message here names."""
    stream = keys.queue("t")
    await client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    ids = [
        (
            await client.execute(
                "XADD", stream, "*", "task_id", f"c{i}", "payload", "{}", "attempt", "0",
                "due_ms", "7", "o", "C",
            )
        ).decode()
        for i in range(2)
    ]  # fmt: skip
    await client.execute("HSET", keys.cancels("t"), "c0:7", "1", "c1:7", "1", "other:7", "1")
    return ids


async def _requests(client: RedisClient, keys: Keys) -> set[str]:
    return {k.decode() for k in await client.execute("HKEYS", keys.cancels("t"))}


async def test_a_purged_cancel_other_fire_takes_its_cancel_request_with_it(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """A ``cancel_other`` fire asked to cancel and purged before any consumer read it
    never ends through an ACK, which is where an ended fire's request goes: left, the
    request (kept as long as the type's later requests push the hash's expiry on) would
    cancel a later fire of the same schedule id, such as a backfill of the purged window.
    A request for a fire not purged stays."""
    ids = await _cancel_other_messages(redis_client, keys)
    deleted, ended, last = await scripts.purge_queue("t", ids[0], 100)  # the first one only
    assert (deleted, [e.task_id for e in ended], last) == (1, ["c0"], ids[0])
    assert await _requests(redis_client, keys) == {"c1:7", "other:7"}


async def test_a_poisoned_cancel_other_fire_takes_its_cancel_request_with_it(
    redis_client: RedisClient, keys: Keys, scripts: Scripts
) -> None:
    """The same for a ``cancel_other`` fire dead-lettered as poison by a reclaim: it never
    ends through an ACK either."""
    ids = await _cancel_other_messages(redis_client, keys)
    await read_as(redis_client, keys, "c1")
    for owner in ("c2", "c3"):
        await redis_client.execute("XCLAIM", keys.queue("t"), GROUP, owner, 0, ids[0])
    await set_idle(redis_client, keys, "c3", [ids[0]])
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")
    assert reclaim.poisoned == [ids[0]]
    assert await _requests(redis_client, keys) == {"c1:7", "other:7"}


async def test_a_purge_whose_flight_ends_are_refused_deletes_nothing(
    redis_client: RedisClient, namespace: str, keys: Keys
) -> None:
    """A purged fire of a task with an overlap policy ends the task's flight. Deleted
    first, a flight end Redis then refused (a write under maxmemory, a key of another
    kind) or a caller cut off between the two would leave the task's mark naming a fire
    that is gone, and the task stuck behind it for good. The flights end first: refused,
    the purge fails having deleted nothing, and a repeat finds the fire where it was."""
    from actors.api.queues import Queues

    store = TaskStore(redis_client, namespace, default_partitions=4)
    stream = keys.queue("t")
    await redis_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    await redis_client.execute(
        "XADD", stream, "*", "task_id", "s0", "payload", "{}", "attempt", "0", "due_ms", "7",
        "o", "S",
    )  # fmt: skip
    flights = (await store.keys()).flights(keys.partition_of("s0"))
    await redis_client.execute("SET", flights, "not a hash")
    with pytest.raises(Exception, match="WRONGTYPE"):
        await Queues(store).purge_queue("t")
    assert await redis_client.execute("XLEN", stream) == 1
    await redis_client.execute("DEL", flights)
    assert await Queues(store).purge_queue("t") == 1
    assert await redis_client.execute("XLEN", stream) == 0
