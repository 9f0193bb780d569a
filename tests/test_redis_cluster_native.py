"""A Cluster's fire-path calls on the node's own sockets (``runtime.redis_cluster_native``),
against real local clusters: each call on the master of its slot, a slot moved or being
migrated to another master, and a master killed before its replica takes over."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.crc
import trio

from runtime import redis_cluster_native
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.errors import RedisUnavailable
from runtime.redis_io import RedisClient, Script
from runtime.redis_wire import if_all_succeeded
from runtime.testing.local_redis import LocalCluster

INCR = Script("incr", "return redis.call('INCR', KEYS[1])")
#: Keys spread over every master (their slots: 0..16383 in steps).
KEYS = [f"{{k{i}}}:n" for i in range(60)]


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A cluster of this test alone: its slots are moved and its masters killed."""
    setup = LocalCluster(find_server_binary()).start()
    try:
        yield setup
    finally:
        setup.remove()


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[RedisClient]:
    """A Cluster client on the node's own sockets (the default), closed after the test."""
    client = client_for(cluster.url)
    try:
        yield client
    finally:
        await client.aclose()


def client_for(url: str, **settings: Any) -> RedisClient:
    return RedisClient.from_settings(url, RedisSection(url=url, cluster=True, **settings))


def admin(port: int) -> Any:
    return redis.Redis(port=port, socket_timeout=5)


def owner(cluster: LocalCluster, key: str) -> int:
    """The index of the master serving ``key``'s slot, as the cluster says."""
    port = _served_by(cluster, redis.crc.key_slot(key.encode()))
    return [n.port for n in cluster.nodes].index(port)


def _served_by(cluster: LocalCluster, slot: int) -> int:
    for start, end, master, *_ in admin(cluster.nodes[0].port).execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return int(master[1])
    raise AssertionError(f"no master serves slot {slot}")


def stat(port: int, name: str) -> int:
    """A server's count of calls of a command (``evalsha``) or replies of an error
    (``MOVED``), from ``INFO``."""
    info = admin(port).info("all")
    if name.isupper():
        return int(info.get(f"errorstat_{name}", {}).get("count", 0))
    return int(info.get(f"cmdstat_{name}", {}).get("calls", 0))


def migrate(cluster: LocalCluster, key: str, to: int, *, finish: bool) -> int:
    """Move ``key``'s slot (with its keys) from its master to master ``to``; unless
    ``finish``, the slot stays the old master's, marked migrating (``ASK``)."""
    slot = redis.crc.key_slot(key.encode())
    source = _served_by(cluster, slot)
    target = cluster.nodes[to].port
    assert source != target
    src, dst = admin(source), admin(target)
    src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    if keys:
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
    if finish:
        for node in cluster.nodes:
            admin(node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return source


async def test_each_call_runs_on_the_master_of_its_slot(
    cluster: LocalCluster, client: RedisClient
) -> None:
    assert await client.scripts(INCR, [([k], []) for k in KEYS]) == [1] * len(KEYS)
    # Counted from here: the masters had to be sent the script once (NOSCRIPT).
    before = {n.port: stat(n.port, "evalsha") for n in cluster.nodes}
    redirects = [(stat(n.port, "MOVED"), stat(n.port, "ASK")) for n in cluster.nodes]
    assert await client.scripts(INCR, [([k], []) for k in KEYS]) == [2] * len(KEYS)
    first, then = await client.scripts_in_order(
        [(INCR, [k], []) for k in KEYS[:10]],
        if_all_succeeded([(INCR, [k], []) for k in KEYS[10:20]]),
    )
    assert first == [3] * 10 and then == [3] * 10
    assert client._routes is not None and not client._routes.stale
    expected = {n.port: 0 for n in cluster.nodes}
    for k in KEYS + KEYS[:20]:
        expected[_served_by(cluster, redis.crc.key_slot(k.encode()))] += 1
    after = {n.port: stat(n.port, "evalsha") for n in cluster.nodes}
    # Every call ran once, where its key lives: no redirect, no second send.
    assert {p: after[p] - before[p] for p in after} == expected
    assert [(stat(n.port, "MOVED"), stat(n.port, "ASK")) for n in cluster.nodes] == redirects
    for k in KEYS[:20]:
        port = _served_by(cluster, redis.crc.key_slot(k.encode()))
        assert admin(port).get(k) == b"3"


async def test_a_slot_moved_to_another_master_is_followed(
    cluster: LocalCluster, client: RedisClient
) -> None:
    key = KEYS[0]
    assert await client.scripts(INCR, [([key], [])]) == [1]  # the map is learned
    source = migrate(cluster, key, (owner(cluster, key) + 1) % 3, finish=True)
    target = _served_by(cluster, redis.crc.key_slot(key.encode()))
    moved = stat(source, "MOVED")
    assert await client.scripts(INCR, [([key], [])]) == [2]
    assert await client.scripts(INCR, [([key], [])]) == [3]
    # One MOVED: the second call went straight to the new master.
    assert stat(source, "MOVED") == moved + 1
    assert admin(target).get(key) == b"3"
    # A stream read follows a moved slot too.
    stream = "{k1}:s"
    await client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
    await client.execute("XADD", stream, "*", "f", "v")
    migrate(cluster, stream, (owner(cluster, stream) + 1) % 3, finish=True)
    reply = await client.execute_unparsed(
        "XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "STREAMS", stream, ">",
        slot_key=stream,
    )  # fmt: skip
    assert not client.reads_parsed
    ((_, fields),) = reply[stream.encode()]
    assert fields == [b"f", b"v"]


async def test_a_slot_being_migrated_is_waited_for_by_a_script_and_followed_by_a_read(
    cluster: LocalCluster, client: RedisClient
) -> None:
    """A script answered ASK is not sent behind ASKING: it waits (transient) until the slot
    has moved, then runs on its new master (``MOVED``). A read of one key is followed
    behind ASKING."""
    key = KEYS[2]
    assert await client.scripts(INCR, [([key], [])]) == [1]
    to = (owner(cluster, key) + 1) % 3
    source = migrate(cluster, key, to, finish=False)
    asked = stat(source, "ASK")
    # The key has moved, its slot not yet: the old master answers ASK.
    with pytest.raises(RedisUnavailable, match="being migrated"):
        await client.scripts(INCR, [([key], [])])
    assert stat(source, "ASK") > asked
    pipe = admin(cluster.nodes[to].port).pipeline(transaction=False)
    assert pipe.execute_command("ASKING").get(key).execute() == [True, b"1"]  # not run
    # A read is sent behind ASKING.
    asked = stat(source, "ASK")
    assert await client.execute_unparsed("GET", key, slot_key=key) == b"1"
    assert stat(source, "ASK") == asked + 1
    slot = redis.crc.key_slot(key.encode())
    target_id = admin(cluster.nodes[to].port).execute_command("CLUSTER", "MYID")
    for node in cluster.nodes:
        admin(node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert await _once_moved(client, INCR, [key], []) == 2  # once: not run before
    assert admin(cluster.nodes[to].port).get(key) == b"2"


async def _once_moved(client: RedisClient, script: Script, keys: list[str], args: list[str]) -> Any:
    """The script's reply once its slot has moved: on a loaded machine the masters may
    take a moment to agree on the new owner, and the call is repeated as ``ride_out``
    repeats a step (a transient failure ran nothing)."""
    with trio.fail_after(30):
        while True:
            try:
                (reply,) = await client.scripts(script, [(keys, args)])
            except RedisUnavailable:
                reply = None
            if reply is not None and not isinstance(reply, Exception):
                return reply
            await trio.sleep(0.2)


#: A script in the shape of the partition scripts: it declares the partition's schedule
#: and builds a task's state key from the tag (ARGV[1]); a state that is not there means
#: a stale schedule entry, removed (``claim_due.lua``).
CLAIM_LIKE = Script(
    "claim_like",
    "local s = redis.call('GET', ARGV[1] .. ':state') "
    "if not s then redis.call('DEL', KEYS[1]) return 'removed' end return s",
)


def _half_migrating(cluster: LocalCluster, tag: str) -> tuple[Any, Any, int, Any, int]:
    """``{tag}:schedule`` (``due``) and ``{tag}:state`` (``active``) on their slot's master,
    the slot then marked as migrating to the next master, no key moved yet: (source,
    target, slot, the target's id, the target's port)."""
    schedule = f"{tag}:schedule"
    home = owner(cluster, schedule)
    port = cluster.nodes[(home + 1) % 3].port
    src, dst = admin(cluster.nodes[home].port), admin(port)
    src.set(schedule, "due")
    src.set(f"{tag}:state", "active")
    slot = redis.crc.key_slot(schedule.encode())
    src_id, dst_id = src.execute_command("CLUSTER", "MYID"), dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    return src, dst, slot, dst_id, port


@pytest.mark.parametrize("moved", ["declared", "built"])
async def test_a_script_meeting_a_slot_half_migrated_waits_and_acts_on_nothing_absent(
    cluster: LocalCluster, client: RedisClient, moved: str
) -> None:
    """A slot moving key by key (a resharding), a partition script's keys split between
    the two masters. Its declared key moved first: the source answers ASK; followed
    behind ASKING, the target would serve the state key (still on the source) as absent
    and the script would remove the schedule entry for good. The key it builds moved
    first: the source fails the script on it ("non local key"). Either way the call is
    transient, nothing is removed, and once the slot has moved it runs as before."""
    tag = "{part7}"
    schedule, state = f"{tag}:schedule", f"{tag}:state"
    src, dst, slot, dst_id, port = _half_migrating(cluster, tag)
    first = schedule if moved == "declared" else state
    src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", first)
    with pytest.raises(RedisUnavailable):
        await client.scripts(CLAIM_LIKE, [([schedule], [tag])])
    pipe = dst.pipeline(transaction=False)
    assert pipe.execute_command("ASKING").exists(first).execute() == [True, 1]
    rest = state if moved == "declared" else schedule
    assert src.exists(rest) == 1  # neither removed
    src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", rest)
    for node in cluster.nodes:
        admin(node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    assert await _once_moved(client, CLAIM_LIKE, [schedule], [tag]) == b"active"
    assert dst.get(schedule) == b"due"


async def test_a_script_still_moved_past_its_redirects_waits_and_acts_on_nothing_absent(
    cluster: LocalCluster, client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's map names a third master for a slot half migrated (the masters
    disagreeing on its owner: answered MOVED past ``_REDIRECTS``, here none). Sent on
    through redis-py, the script met ASK there and was followed behind ASKING: the target
    served the state key, still on the source, as absent, and the script removed its
    schedule entry. It is transient instead, and nothing is removed."""
    tag = "{part9}"
    schedule, state = f"{tag}:schedule", f"{tag}:state"
    home = owner(cluster, schedule)
    src, dst, slot, _, port = _half_migrating(cluster, tag)
    assert await client.scripts(CLAIM_LIKE, [([schedule], [tag])]) == [b"active"]
    await client.run_sync(lambda: client.raw.get(schedule))  # redis-py's own map learned
    src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", schedule)
    routes = client._routes
    assert routes is not None
    routes._slots[slot] = ("127.0.0.1", cluster.nodes[(home + 2) % 3].port)  # a stale map
    routes._by_key = {}
    monkeypatch.setattr(redis_cluster_native, "_REDIRECTS", 0)
    with pytest.raises(RedisUnavailable, match="TRYAGAIN"):
        await client.scripts(CLAIM_LIKE, [([schedule], [tag])])
    pipe = dst.pipeline(transaction=False)
    assert pipe.execute_command("ASKING").exists(schedule).execute() == [True, 1]
    assert src.exists(state) == 1


async def test_a_killed_master_is_waited_for_until_its_replica_takes_over() -> None:
    cluster = LocalCluster(find_server_binary(), replicas=True).start()
    client = client_for(cluster.url)
    try:
        key = next(k for k in KEYS if owner(cluster, k) == 1)
        assert await client.scripts(INCR, [([key], [])]) == [1]
        assert admin(cluster.nodes[1].port).execute_command("WAIT", 1, 10_000) == 1
        assert await client.ping()
        cluster.nodes[1].kill()  # SIGKILL
        with pytest.raises(RedisUnavailable):
            await client.scripts(INCR, [([key], [])])
        # While the dead master still serves the slot, Redis is not reachable: the
        # probe ride_out waits on fails, so the step is not repeated in a loop.
        with pytest.raises(RedisUnavailable):
            await client.ping()
        with pytest.raises(RedisUnavailable):
            await client.ping()
        replica = admin(cluster.replicas[1].port)
        await trio.to_thread.run_sync(
            lambda: replica.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        )
        with trio.fail_after(60):
            while True:
                try:
                    if await client.ping():
                        break
                except RedisUnavailable:
                    await trio.sleep(0.1)
        assert await client.scripts(INCR, [([key], [])]) == [2]
        assert replica.get(key) == b"2"
    finally:
        await client.aclose()
        cluster.remove()


async def test_without_native_io_a_cluster_stays_on_redis_py(cluster: LocalCluster) -> None:
    client = client_for(cluster.url, native_io=False)
    try:
        assert client._routes is None
        assert await client.scripts(INCR, [([k], []) for k in KEYS[:6]]) == [1] * 6
        stream = "{k3}:s"
        await client.execute("XGROUP", "CREATE", stream, "g", "$", "MKSTREAM")
        await client.execute("XADD", stream, "*", "f", "v")
        assert client.reads_parsed
        reply = await client.execute_unparsed(
            "XREADGROUP", "GROUP", "g", "c", "COUNT", 10, "STREAMS", stream, ">",
            slot_key=stream,
        )  # fmt: skip
        ((name, ((_, fields),)),) = reply  # parsed: a dict of fields per entry
        assert (name, fields) == (stream.encode(), {b"f": b"v"})
    finally:
        await client.aclose()


async def test_a_master_that_cannot_be_reached_fails_the_call_before_anything_is_sent(
    cluster: LocalCluster, client: RedisClient
) -> None:
    """The connections to every master the call needs are taken before any is sent on: a
    repeat then sends every write once, not a second time to the masters that ran it."""
    keys = [next(k for k in KEYS if owner(cluster, k) == i) for i in range(3)]
    assert await client.scripts(INCR, [([k], []) for k in keys]) == [1, 1, 1]
    cluster.nodes[1].kill()  # SIGKILL; no replica takes over
    with pytest.raises(RedisUnavailable):
        await client.scripts(INCR, [([k], []) for k in keys])
    assert admin(cluster.nodes[0].port).get(keys[0]) == b"1"
    assert admin(cluster.nodes[2].port).get(keys[2]) == b"1"
    # The map is stale: the probe fails while the dead master serves its slots.
    with pytest.raises(RedisUnavailable):
        await client.ping()
    # A call for the live masters alone still goes through.
    assert await client.scripts(INCR, [([keys[0]], []), ([keys[2]], [])]) == [2, 2]


async def test_a_master_lost_mid_call_leaves_the_others_replies_to_then(
    cluster: LocalCluster,
) -> None:
    """A master killed while it runs its part of ``scripts_in_order``'s first round: its
    calls are unknown (``RedisUnavailable`` in place), but the other masters' replies are
    still read and handed to ``then``, so a repeat sends only what is not known to have
    run; the call then fails as an outage, with no second round."""
    client = client_for(cluster.url)
    keys = [next(k for k in KEYS if owner(cluster, k) == i) for i in range(3)]
    spin = Script(
        "spin",
        "local function now() local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 end "
        "local s = now() while now() - s < tonumber(ARGV[1]) do end "
        "return redis.call('INCR', KEYS[1])",
    )
    assert await client.scripts(spin, [([keys[1]], ["0"])]) == [1]  # loaded there
    watcher = redis.Redis(port=cluster.nodes[1].port, socket_timeout=30)
    watcher.config_set("lua-time-limit", 100)  # others are answered BUSY while it spins
    seen: list[object] = []

    def then(replies: list[object]) -> list[tuple[Script, list[str], list[str]]]:
        seen.extend(replies)
        return [(INCR, [k], []) for k in keys]

    def kill_once_it_spins() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                watcher.ping()
            except redis.exceptions.ResponseError as exc:
                if str(exc).startswith("BUSY"):
                    cluster.nodes[1].kill()  # SIGKILL, mid-script
                    return
                raise
            time.sleep(0.02)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(
                        trio.to_thread.run_sync, kill_once_it_spins, abandon_on_cancel=True
                    )
                )
                with pytest.raises(RedisUnavailable):
                    await client.scripts_in_order(
                        [(INCR, [keys[0]], []), (spin, [keys[1]], ["20000"]),
                         (INCR, [keys[2]], [])],
                        then,
                    )  # fmt: skip
    finally:
        await client.aclose()
    assert seen[0] == 1 and seen[2] == 1, seen
    assert isinstance(seen[1], RedisUnavailable)
    assert client._routes is not None and client._routes.stale
    # The second round was not sent; the live masters ran their first-round part once.
    assert admin(cluster.nodes[0].port).get(keys[0]) == b"1"
    assert admin(cluster.nodes[2].port).get(keys[2]) == b"1"


async def test_silent_masters_are_unknown_parts_and_the_others_are_kept(
    cluster: LocalCluster,
) -> None:
    """Two masters paused past the socket timeout under ``scripts_in_order``'s first round:
    their parts are unknown (``RedisUnavailable`` in place), the third master's reply is
    handed to ``then``, and the call fails as an outage without a second round."""
    client = client_for(cluster.url, socket_timeout_s=0.5)
    keys = [next(k for k in KEYS if owner(cluster, k) == i) for i in range(3)]
    seen: list[object] = []

    def then(replies: list[object]) -> list[tuple[Script, list[str], list[str]]]:
        seen.extend(replies)
        return [(INCR, [k], []) for k in keys]

    try:
        assert await client.scripts(INCR, [([k], []) for k in keys]) == [1, 1, 1]
        for i in (1, 2):
            admin(cluster.nodes[i].port).execute_command("CLIENT", "PAUSE", 5000, "ALL")
        with pytest.raises(RedisUnavailable):
            await client.scripts_in_order([(INCR, [k], []) for k in keys], then)
        assert seen[0] == 2, seen
        assert all(isinstance(r, RedisUnavailable) for r in seen[1:]), seen
        assert admin(cluster.nodes[0].port).get(keys[0]) == b"2"  # no second round
    finally:
        await client.aclose()


async def test_a_cluster_none_of_whose_nodes_answers_is_an_outage(
    cluster: LocalCluster, client: RedisClient
) -> None:
    assert await client.scripts(INCR, [([k], []) for k in KEYS[:3]]) == [1, 1, 1]
    for node in cluster.nodes:
        node.kill()
    with pytest.raises(RedisUnavailable):
        await client.scripts(INCR, [([KEYS[0]], [])])
    with pytest.raises(RedisUnavailable):
        await client.ping()
    assert not client.reachable


async def test_a_call_answered_tryagain_is_sent_again_alone(
    cluster: LocalCluster, client: RedisClient
) -> None:
    """A slot half-migrated (one of a call's keys moved, one not): Redis answers TRYAGAIN,
    the call did not run. It is sent again alone, a few times; the rest of the batch ran
    once and is not sent again within the call."""
    two = Script("two", "redis.call('INCR', KEYS[1]) return redis.call('INCR', KEYS[2])")
    key_a, key_b = "{t}:a", "{t}:b"
    assert await client.scripts(two, [([key_a, key_b], [])]) == [1]
    home = owner(cluster, key_a)
    others = [next(k for k in KEYS if owner(cluster, k) == i) for i in range(3) if i != home]
    slot = redis.crc.key_slot(key_a.encode())
    source, target = admin(cluster.nodes[home].port), admin(cluster.nodes[(home + 1) % 3].port)
    source_id = source.execute_command("CLUSTER", "MYID")
    target_id = target.execute_command("CLUSTER", "MYID")
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    port = cluster.nodes[(home + 1) % 3].port
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", key_a)
    tried = stat(cluster.nodes[home].port, "TRYAGAIN")
    calls: list[tuple[Script, list[str], list[str]]] = [(two, [key_a, key_b], [])]
    calls += [(INCR, [k], []) for k in others]
    calls += [(INCR, [key_a], [])]  # answered ASK: its key has moved
    with pytest.raises(RedisUnavailable, match="TRYAGAIN"):
        await client.mixed_scripts(calls)
    assert stat(cluster.nodes[home].port, "TRYAGAIN") == tried + 4  # the first + 3 again
    # Ran once within the call (its step, repeated, would send them again).
    assert [_get(cluster, k) for k in others] == [b"1", b"1"]
    # The ASK was not followed: the call was failing anyway, and its step's repeat
    # would have run that write a second time.
    pipe = target.pipeline(transaction=False)
    assert pipe.execute_command("ASKING").get(key_a).execute() == [True, b"1"]
    # The migration ends: the call goes through (MOVED), on the new master.
    source.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", key_b)
    for node in cluster.nodes:
        admin(node.port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert await client.mixed_scripts(calls[:1]) == [2]
    assert (target.get(key_a), target.get(key_b)) == (b"2", b"2")


async def test_a_cross_slot_mistake_is_not_an_outage(
    cluster: LocalCluster, client: RedisClient
) -> None:
    """redis-py refuses a script whose keys span slots before sending it: a mistake to
    surface, not an outage to wait out for ever."""
    two = Script("two", "return 1")
    with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
        await client.script(two, ["{a}:x", "{b}:y"], [])
    assert client.reachable


def _get(cluster: LocalCluster, key: str) -> Any:
    return admin(_served_by(cluster, redis.crc.key_slot(key.encode()))).get(key)
