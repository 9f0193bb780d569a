"""Redis refusing commands: every error reply classified, nothing acknowledged that
depends on a refused write, no actor crashing on a reply.

Each test runs against a real redis-server: the suite's own (a namespace of its own) where
the fault is confined to one key, a dedicated one where the fault is server-wide
(``maxmemory``, a busy script, ACL users)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
import trio

from actors.config import ConsumerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution.claimer import Claimer, ClaimerSettings
from actors.execution.consumer import ConsumerState
from actors.store.keys import GROUP
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.channels import Mailbox
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from runtime.redis_replies import ReplyClass, reply_class
from runtime.testing.local_redis import RedisProcess
from tests.execution_harness import (
    node_config,
    periodic_tasks,
    records,
    running_node,
    wait_every_fire_ran,
    wait_until,
)

LogLines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A server of this test alone: its faults reach no other test."""
    process = RedisProcess(find_server_binary()).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
async def own_client(server: RedisProcess) -> Any:
    client = RedisClient.from_settings(server.url, RedisSection(url=server.url))
    try:
        yield client
    finally:
        await client.aclose()


async def _true(value: bool) -> bool:
    return value


def _events(log_lines: LogLines, name: str) -> list[dict[str, Any]]:
    return [e for e in log_lines() if e["event"] == name]


async def _pending(store: TaskStore, task_type: str) -> int:
    keys = await store.keys()
    summary = await store.client.execute("XPENDING", keys.queue(task_type), GROUP)
    return int(summary["pending"])


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("LOADING Redis is loading the dataset in memory", ReplyClass.TRANSIENT),
        ("BUSY Redis is busy running a script.", ReplyClass.TRANSIENT),
        ("CLUSTERDOWN The cluster is down", ReplyClass.TRANSIENT),
        ("READONLY You can't write against a read only replica.", ReplyClass.TRANSIENT),
        ("OOM command not allowed when used memory > 'maxmemory'. script: 1f, on @user_script:3.",
         ReplyClass.REFUSED_WRITE),
        ("MISCONF Redis is configured to save RDB snapshots", ReplyClass.REFUSED_WRITE),
        ("NOREPLICAS Not enough good replicas to write.", ReplyClass.REFUSED_WRITE),
        ("NOPERM User u has no permissions to run the 'xadd' command", ReplyClass.PERMISSION),
        ("ERR The user executing the script can't run this command or subcommand script: 1f",
         ReplyClass.PERMISSION),
        ("ERR unknown command 'FLUSHALL', with args beginning with: ", ReplyClass.PERMISSION),
        ("WRONGTYPE Operation against a key holding the wrong kind of value",
         ReplyClass.REJECTED),
        ("ERR syntax error", ReplyClass.REJECTED),
    ],
)  # fmt: skip
def test_every_error_reply_has_one_class(reply: str, kind: ReplyClass) -> None:
    assert reply_class(reply) is kind


async def test_a_failed_run_stays_pending_while_its_retry_write_is_refused(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """The retry key holds a string: the retry write fails with WRONGTYPE. The failed run
    must not be acknowledged (it would be lost: no retry, no dead letter): it is held back
    (``completions_held_back``, its partition's alone), and retried once the key is fixed;
    no actor crashes meanwhile."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(
        handler="tests.handlers.jobs:flaky", max_attempts=3, backoff_base_s=0.05
    )
    config = node_config(redis_url, namespace, tmp_path, {"flaky": section})
    await store.create(TaskSpec("flaky", Schedule("once", at_ms=0), {"succeed_on": 1}, task_id="f"))
    keys = await store.keys()
    retry_key = keys.retry(keys.partition_of("f"))
    await redis_client.execute("SET", retry_key, "not a sorted set")
    async with running_node(config):
        await wait_until(lambda: _true(any(r["event"] == "failed" for r in records(record))))
        await wait_until(lambda: _true(bool(_events(log_lines, "completions_held_back"))))
        await trio.sleep(1.5)  # the consumer tries its held fire again meanwhile
        assert await _pending(store, "flaky") == 1  # not acknowledged
        assert not [e for e in log_lines() if e["event"] == "retried"]
        await redis_client.execute("DEL", retry_key)
        await wait_until(lambda: _true(any(r["event"] == "ran" for r in records(record))))
    assert [(r["event"], r["attempt"]) for r in records(record)] == [("failed", 0), ("ran", 1)]
    assert not _events(log_lines, "actor_crashed")
    (held,) = _events(log_lines, "completions_held_back")
    assert held["partition"] == keys.partition_of("f") and "WRONGTYPE" in held["error"]
    assert _events(log_lines, "completions_resumed")
    assert await redis_client.execute("XLEN", keys.dlq("flaky")) == 0


async def test_writes_refused_at_maxmemory_lose_no_retry(
    server: RedisProcess, own_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    """Redis at maxmemory (noeviction) while a failing run finishes: its retry is written
    once Redis takes writes again, and runs; nothing was acknowledged before."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    section = ConsumerSection(
        handler="tests.handlers.jobs:slow_flaky", max_attempts=3, backoff_base_s=0.05
    )
    config = node_config(server.url, namespace, tmp_path, {"slow": section})
    payload = {"succeed_on": 1, "sleep_s": 1.0}
    await store.create(TaskSpec("slow", Schedule("once", at_ms=0), payload, task_id="s"))
    async with running_node(config):
        await wait_until(lambda: _true(any(r["event"] == "started" for r in records(record))))
        await own_client.execute("CONFIG", "SET", "maxmemory", "1")
        await wait_until(lambda: _true(any(r["event"] == "failed" for r in records(record))))
        await wait_until(
            lambda: _true(
                any(e.get("kind") == "refused_write" for e in _events(log_lines, "redis_refused"))
            )
        )
        await trio.sleep(1.0)  # the batch's completion is refused meanwhile, again and again
        assert await _pending(store, "slow") == 1  # not acknowledged
        assert not _events(log_lines, "retried")  # its retry not written either
        await own_client.execute("CONFIG", "SET", "maxmemory", "0")
        await wait_until(lambda: _true(any(r["event"] == "ran" for r in records(record))))
    runs = [(r["event"], r["attempt"]) for r in records(record)]
    assert runs == [("started", 0), ("failed", 0), ("started", 1), ("ran", 1)]
    assert len(_events(log_lines, "retried")) == 1
    assert not _events(log_lines, "actor_crashed")
    refused = _events(log_lines, "redis_refused")
    assert "maxmemory" in refused[0]["fix"] or "OOM" in refused[0]["fix"]


async def test_a_poison_message_refused_at_maxmemory_holds_up_no_reclaim(
    own_client: RedisClient, namespace: str
) -> None:
    """Redis at maxmemory (noeviction): a poison message's dead letter (an XADD) is
    refused, and it came first in the window; the reclaim leaves it pending and says why,
    and takes the dead consumer's other messages over all the same (a refused XADD that
    failed the whole call would leave no reclaim, and no trim behind it, while Redis
    stays full)."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    keys, scripts = await store.keys(), await store.scripts()
    stream = keys.queue("t")
    await own_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    ids = [
        (await own_client.execute("XADD", stream, "*", "task_id", f"x{i}", "payload", "{}",
                                  "attempt", "0", "due_ms", "7")).decode()
        for i in range(3)
    ]  # fmt: skip
    await own_client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", stream, ">")
    for _ in range(2):  # the first one delivered three times: poison at max_deliveries 3
        await own_client.execute("XCLAIM", stream, GROUP, "dead", 0, ids[0])
    raw = own_client.raw
    await own_client.run_sync(
        lambda: raw.xclaim(stream, GROUP, "dead", 0, ids, idle=10**9, justid=True)
    )
    await own_client.execute("CONFIG", "SET", "maxmemory", "1")
    try:
        reclaim = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")
    finally:
        await own_client.execute("CONFIG", "SET", "maxmemory", "0")
    assert [r.msg_id for r in reclaim.claimed] == ids[1:]
    assert reclaim.poisoned == [] and "OOM" in reclaim.held
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")  # once Redis has room
    assert reclaim.poisoned == [ids[0]] and reclaim.held == ""


async def test_a_poison_entry_with_more_fields_than_a_script_passes_on_is_dead_lettered(
    own_client: RedisClient, namespace: str
) -> None:
    """A message carrying 5,000 fields (another program's) delivered max_deliveries times:
    its dead letter keeps the first fields and the rest in one (``folded``), and is
    written: one XADD of them all, past what Lua 5.1 passes to a call, failed the whole
    reclaim, every claimer's, every round (no take-over, no dead letter, no trim)."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    keys, scripts = await store.keys(), await store.scripts()
    stream = keys.queue("t")
    await own_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    many = [x for i in range(5000) for x in (f"f{i}", f"v{i}")]
    fields = ["task_id", "x0", "payload", "{}", "attempt", "0", "due_ms", "7"]
    poison = (await own_client.execute("XADD", stream, "*", *fields, *many)).decode()
    other = (await own_client.execute("XADD", stream, "*", *fields)).decode()
    await own_client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", stream, ">")
    for _ in range(2):  # delivered three times: poison at max_deliveries 3
        await own_client.execute("XCLAIM", stream, GROUP, "dead", 0, poison)
    raw = own_client.raw
    await own_client.run_sync(
        lambda: raw.xclaim(stream, GROUP, "dead", 0, [poison, other], idle=10**9, justid=True)
    )
    reclaim = await scripts.reclaim("t", "me", 1000, 10, 3, "n1")
    assert reclaim.poisoned == [poison] and reclaim.held == ""
    assert [r.msg_id for r in reclaim.claimed] == [other]
    ((_, entry),) = await own_client.execute("XRANGE", keys.dlq("t"), "-", "+")
    assert entry[b"reason"] == b"poison" and entry[b"task_id"] == b"x0"
    rest = msgpack.unpackb(entry[b"folded"], raw=True)
    kept = [k for k in entry if k.startswith(b"f") and k != b"folded"]
    assert len(kept) + len(rest) // 2 == 5000 and rest[-2:] == [b"f4999", b"v4999"]


def _busy_script(url: str, seconds: float) -> threading.Thread:
    """A Lua busy loop of ``seconds`` on another connection (Redis answers BUSY meanwhile)."""
    loop = (
        "local t0 = redis.call('TIME') local s = tonumber(ARGV[1]) "
        "while true do local t = redis.call('TIME') "
        "if (t[1] - t0[1]) + (t[2] - t0[2]) / 1e6 > s then return 1 end end"
    )
    client = redis.Redis.from_url(url, socket_timeout=seconds + 30)
    thread = threading.Thread(target=client.eval, args=(loop, 0, seconds), daemon=True)
    thread.start()
    return thread


async def test_a_busy_script_is_ridden_out_like_an_outage(
    server: RedisProcess, own_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    store = TaskStore(own_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop", concurrency=20, lease_s=3)
    config = node_config(server.url, namespace, tmp_path, {"work": section})
    await own_client.execute("CONFIG", "SET", "busy-reply-threshold", "100")
    ids, start_ms = await periodic_tasks(store, 10, 0.5)
    async with running_node(config):
        await wait_until(lambda: _true(len(records(record)) >= 20))
        busy = _busy_script(server.url, 3.0)
        await trio.to_thread.run_sync(busy.join)
        until_ms = await store.now_ms() + 1500
        await wait_every_fire_ran(record, ids, start_ms, until_ms)
    assert any("BUSY" in e["error"] for e in _events(log_lines, "redis_unreachable"))
    assert not _events(log_lines, "actor_crashed")
    assert not _events(log_lines, "redis_refused")


async def test_a_missing_permission_is_one_line_and_a_wait_not_a_crash(
    server: RedisProcess, own_client: RedisClient, log_lines: LogLines
) -> None:
    await own_client.execute("ACL", "SETUSER", "limited", "on", ">pw", "~*", "+@all", "-xlen")
    url = f"redis://limited:pw@127.0.0.1:{server.port}/0"
    client = RedisClient.from_settings(url, RedisSection(url=url))
    try:
        with pytest.raises(RedisRefused) as refused:
            await client.execute("XLEN", "s")
        assert refused.value.kind == "permission"
        assert isinstance(refused.value, RedisUnavailable)  # API: 503, never a 500
        result: list[int] = []

        async def step() -> None:
            result.append(await client.execute("XLEN", "s"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.ride_out, step, "node/test")
            await wait_until(lambda: _true(len(_events(log_lines, "redis_refused")) >= 1))
            assert client.refusing == "permission"
            await trio.sleep(0.5)  # refused again meanwhile, logged once
            await own_client.execute("ACL", "SETUSER", "limited", "+xlen")
            await wait_until(lambda: _true(bool(result)))
        (line,) = _events(log_lines, "redis_refused")
        assert line["kind"] == "permission" and "users.acl" in line["fix"]
        assert line["actor"] == "node/test"
        assert _events(log_lines, "redis_accepting")
        assert client.refusing is None
    finally:
        await client.aclose()


async def test_a_refused_trim_does_not_hold_up_the_reclaims(
    server: RedisProcess, own_client: RedisClient, namespace: str, log_lines: LogLines
) -> None:
    """The claimer's housekeeping (trim, prune) refused for good (here the ACL lacks
    XTRIM): it is skipped with one line, and the claimer keeps taking over dead consumers'
    messages round after round."""
    await own_client.execute("ACL", "SETUSER", "notrim", "on", ">pw", "~*", "+@all", "-xtrim")
    url = f"redis://notrim:pw@127.0.0.1:{server.port}/0"
    client = RedisClient.from_settings(url, RedisSection(url=url))
    store = TaskStore(client, namespace, default_partitions=4)
    keys = await store.keys()
    stream = keys.queue("t")
    await own_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    done = await own_client.execute("XADD", stream, "*", "task_id", "done")
    await own_client.execute("XREADGROUP", "GROUP", GROUP, "c", "STREAMS", stream, ">")
    await own_client.execute("XACK", stream, GROUP, done)  # acknowledged: the trim's to drop
    state = ConsumerState(name="alive")
    state.free.value = 5
    inbox: Mailbox[Message] = Mailbox.open(5)
    claimer = Claimer(store, "t", state, inbox, "n1", ClaimerSettings(interval_s=0.05, lease_s=0.2))
    ctx = ActorContext("node/consumers/t/claimer", 1.0, get_logger(actor="claimer"))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(claimer.run, ctx)
            await wait_until(lambda: _true(bool(_events(log_lines, "housekeeping_skipped"))))
            for i in range(2):  # a consumer dies holding a message, twice
                await own_client.execute(
                    "XADD", stream, "*", "task_id", f"x{i}", "payload", "{}", "attempt", "0",
                    "due_ms", "5",
                )  # fmt: skip
                await own_client.execute(
                    "XREADGROUP", "GROUP", GROUP, f"dead{i}", "STREAMS", stream, ">"
                )
                with trio.fail_after(30):
                    handed = await inbox.receive.receive()
                assert handed.task_id == f"x{i}"
            nursery.cancel_scope.cancel()
    finally:
        await client.aclose()
    (skipped,) = _events(log_lines, "housekeeping_skipped")
    assert skipped["kind"] == "permission"


async def test_a_poison_ends_key_of_another_kind_holds_poison_back_and_no_reclaim(
    own_client: RedisClient, namespace: str, log_lines: LogLines
) -> None:
    """The claimer's poison ends (``Keys.poison_ends``) holding another kind of value: a
    poison message is left pending, said once (``poison_held``), not dead-lettered with
    its flight's end and history entry nowhere to wait; the claimer's round goes on and
    takes a dead consumer's other messages over; once the key is removed, the poison goes
    to the dead-letter stream."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    keys = await store.keys()
    stream = keys.queue("t")
    await own_client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    poison = await own_client.execute(
        "XADD", stream, "*", "task_id", "p", "payload", "{}", "attempt", "0", "due_ms", "7"
    )  # fmt: skip
    await own_client.execute("XREADGROUP", "GROUP", GROUP, "dead", "STREAMS", stream, ">")
    for _ in range(2):  # delivered three times: poison at max_deliveries 3
        await own_client.execute("XCLAIM", stream, GROUP, "dead", 0, poison)
    await own_client.execute("SET", keys.poison_ends("t", "alive"), "not a hash")
    state = ConsumerState(name="alive")
    state.free.value = 5
    inbox: Mailbox[Message] = Mailbox.open(5)
    settings = ClaimerSettings(interval_s=0.05, lease_s=0.2, max_deliveries=3)
    claimer = Claimer(store, "t", state, inbox, "n1", settings)
    ctx = ActorContext("node/consumers/t/claimer", 1.0, get_logger(actor="claimer"))
    async with trio.open_nursery() as nursery:
        await nursery.start(claimer.run, ctx)
        await own_client.execute(
            "XADD", stream, "*", "task_id", "x", "payload", "{}", "attempt", "0", "due_ms", "5"
        )  # fmt: skip
        await own_client.execute("XREADGROUP", "GROUP", GROUP, "dead2", "STREAMS", stream, ">")
        with trio.fail_after(30):
            handed = await inbox.receive.receive()
        assert handed.task_id == "x"
        assert await own_client.execute("XLEN", keys.dlq("t")) == 0
        await own_client.execute("DEL", keys.poison_ends("t", "alive"))
        await wait_until(lambda: _xlen_is(own_client, keys.dlq("t"), 1))
        nursery.cancel_scope.cancel()
    (held,) = _events(log_lines, "poison_held")
    assert "WRONGTYPE" in held["error"]


async def _xlen_is(client: RedisClient, key: str, length: int) -> bool:
    return bool(await client.execute("XLEN", key) == length)


async def test_a_refused_read_waits_with_backoff_and_one_line(
    server: RedisProcess, own_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    """The consumer's read refused (here the ACL lacks XREADGROUP; NOREPLICAS does the same
    to a write command): PING still answers, so the reader must wait the refusal backoff,
    not spin; one line for the run; it reads again once allowed."""
    await own_client.execute(
        "ACL", "SETUSER", "noread", "on", ">pw", "~*", "&*", "+@all", "-xreadgroup"
    )
    url = f"redis://noread:pw@127.0.0.1:{server.port}/0"
    store = TaskStore(own_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop")
    config = node_config(url, namespace, tmp_path, {"work": section}, pollers=0)
    await store.create(TaskSpec("work", Schedule("once", at_ms=0), task_id="w"))
    stream = (await store.keys()).queue("work")
    await own_client.execute(
        "XADD", stream, "*", "task_id", "w", "payload", "{}", "attempt", "0", "due_ms", "5"
    )
    async with running_node(config):
        await wait_until(lambda: _true(bool(_events(log_lines, "redis_refused"))))
        await trio.sleep(3)
        denied = await own_client.execute("ACL", "LOG")
        reads = sum(int(e[b"count"]) for e in denied if e[b"object"] == b"xreadgroup")
        assert 0 < reads < 30, reads  # a backoff, not a PING loop (hundreds a second)
        await own_client.execute("ACL", "SETUSER", "noread", "+xreadgroup")
        await wait_until(lambda: _true(any(r["task_id"] == "w" for r in records(record))))
    assert len(_events(log_lines, "redis_refused")) == 1
    assert _events(log_lines, "redis_accepting")
    assert not _events(log_lines, "actor_crashed")


@pytest.mark.parametrize("lease_s", [3.0, 1.2])
async def test_a_running_fire_keeps_its_lease_while_redis_refuses_writes(
    server: RedisProcess, own_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines, lease_s: float,
) -> None:  # fmt: skip
    """Redis at maxmemory refuses the consumer's hold on its name (a SET), but not the
    renewal of its messages' leases (XCLAIM): a fire still running keeps its lease
    however long the refusal lasts, so no claimer takes it from a live consumer and runs
    it again (a refusal longer than the lease used to let one), also with a lease shorter
    than the refusal backoff's usual cap of 2 s (renewed every lease/3 while refused)."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:sleepy", lease_s=lease_s)
    config = node_config(server.url, namespace, tmp_path, {"slow": section})
    await store.create(TaskSpec("slow", Schedule("once", at_ms=0), {"sleep_s": 10}, task_id="s"))
    keys = await store.keys()

    async def idle_ms() -> int:
        read = "return redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 10)"  # as sent
        (entry,) = await own_client.execute("EVAL", read, 1, keys.queue("slow"), GROUP)
        return int(entry[2])

    async with running_node(config):
        await wait_until(lambda: _true(any(r["event"] == "started" for r in records(record))))
        await own_client.execute("CONFIG", "SET", "maxmemory", "1")
        await wait_until(lambda: _true(bool(_events(log_lines, "redis_refused"))))
        idles = []
        # two leases and more (the short one: several, the usual backoff reaching its cap)
        for _ in range(int(8 / (lease_s / 12))):
            await trio.sleep(lease_s / 12)
            idles.append(await idle_ms())
        await own_client.execute("CONFIG", "SET", "maxmemory", "0")
        await wait_until(lambda: _true(any(r["event"] == "ran" for r in records(record))))
    assert max(idles) < lease_s * 1000, idles  # renewed throughout
    assert [r["event"] for r in records(record)] == ["started", "ran"]
    assert not _events(log_lines, "actor_crashed")


async def test_a_running_fire_keeps_its_lease_while_its_consumers_name_key_is_rejected(
    redis_url: str, redis_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    """The key that holds the consumer's name comes to hold another kind of value (a hand
    edit: WRONGTYPE to the name's hold): the fire running keeps its lease all the same,
    so no claimer takes it from a live consumer to run it again."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:sleepy", lease_s=1.2)
    config = node_config(redis_url, namespace, tmp_path, {"slow": section})
    await store.create(TaskSpec("slow", Schedule("once", at_ms=0), {"sleep_s": 6}, task_id="s"))
    keys = await store.keys()

    async def idle_ms() -> int:
        read = "return redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 10)"  # as sent
        (entry,) = await redis_client.execute("EVAL", read, 1, keys.queue("slow"), GROUP)
        return int(entry[2])

    async with running_node(config):
        await wait_until(lambda: _true(any(r["event"] == "started" for r in records(record))))
        (owner,) = await redis_client.execute("KEYS", keys.owner("slow", "*"))
        await redis_client.execute("DEL", owner)
        await redis_client.execute("HSET", owner, "not", "a name")
        idles = []
        for _ in range(30):  # three leases and more
            await trio.sleep(0.15)
            idles.append(await idle_ms())
        await redis_client.execute("DEL", owner)
        await wait_until(lambda: _true(any(r["event"] == "ran" for r in records(record))))
    assert max(idles) < 1200, idles  # renewed throughout
    assert [r["event"] for r in records(record)] == ["started", "ran"]


async def test_a_type_whose_stream_is_rejected_at_start_holds_back_that_type_alone(
    redis_url: str, redis_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    """Type ``a``'s stream key holds a string when the node starts (its group cannot be
    created: ``WRONGTYPE``). The node starts all the same, type ``b``'s fires run, and
    ``a``'s run once the key is fixed: one type's setup refused holds back that type alone,
    not every actor started after it (the other types, the API)."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop")
    config = node_config(redis_url, namespace, tmp_path, {"a": section, "b": section})
    keys = await store.keys()
    await redis_client.execute("SET", keys.queue("a"), "not a stream")
    for task_type in ("a", "b"):
        await store.create(TaskSpec(task_type, Schedule("once", at_ms=0), task_id=task_type))
    with trio.fail_after(60):
        async with running_node(config):
            await wait_until(lambda: _true(any(r["task_id"] == "b" for r in records(record))))
            assert not any(r["task_id"] == "a" for r in records(record))
            await redis_client.execute("DEL", keys.queue("a"))
            await wait_until(lambda: _true(any(r["task_id"] == "a" for r in records(record))))
    assert not _events(log_lines, "actor_crashed")


async def test_a_consumer_waiting_out_its_setup_stops_when_asked(
    redis_url: str, redis_client: RedisClient, namespace: str, tmp_path: Path,
    log_lines: LogLines,
) -> None:  # fmt: skip
    """A type whose stream Redis rejects at start waits its setup out; asked to stop, it
    stops at once (it holds nothing yet) rather than after the node's whole grace, which
    would cut off every actor stopping after it."""
    store = TaskStore(redis_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:noop")
    config = node_config(redis_url, namespace, tmp_path, {"a": section}, grace_s=60)
    await redis_client.execute("SET", (await store.keys()).queue("a"), "not a stream")
    async with running_node(config):
        await wait_until(
            lambda: _true(
                any(e.get("kind") == "rejected" for e in _events(log_lines, "redis_refused"))
            )
        )
        asked = trio.current_time()
    took = trio.current_time() - asked
    assert took < 30, took  # not the 60 s grace
    assert not _events(log_lines, "consumer_ready")
    assert not _events(log_lines, "actor_crashed")


async def test_a_stop_whose_last_flush_redis_refuses_still_hands_the_fires_back(
    server: RedisProcess, own_client: RedisClient, namespace: str, tmp_path: Path,
    record: Path, log_lines: LogLines,
) -> None:  # fmt: skip
    """A node stops while Redis refuses writes (maxmemory): its consumer's last flush is
    refused again and again. It gets half the cleanup's time; then what the consumer held
    is handed back all the same (release.lua writes nothing Redis refuses then), to run
    again at once elsewhere, not after a lease, and without a delivery counted against
    it. Waiting on the flush for the whole cleanup left the release out."""
    store = TaskStore(own_client, namespace, default_partitions=4)
    section = ConsumerSection(handler="tests.handlers.jobs:sleepy")
    config = node_config(server.url, namespace, tmp_path, {"slow": section}, grace_s=4.0)
    await store.create(TaskSpec("slow", Schedule("once", at_ms=0), {"sleep_s": 1.5}))
    try:
        async with running_node(config):
            await wait_until(lambda: _true(any(r["event"] == "started" for r in records(record))))
            await own_client.execute("CONFIG", "SET", "maxmemory", "1")
        keys = await store.keys()
        raw = own_client.raw
        (entry,) = await own_client.run_sync(
            lambda: raw.xpending_range(keys.queue("slow"), GROUP, "-", "+", 10)
        )  # ran, its outcome never written: pending, handed back (idle ten years)
        assert entry["time_since_delivered"] >= 10**11, entry
        assert _events(log_lines, "last_flush_cut")
        assert _events(log_lines, "released")
    finally:
        await own_client.execute("CONFIG", "SET", "maxmemory", "0")
