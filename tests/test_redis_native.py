"""The fire path's calls on trio sockets (``runtime.redis_native``), against real servers:
the same replies as through redis-py, a server restarted under idle connections, a stalled
server, cancellation, and an abandoned write that ``wait_abandoned`` waits for."""

from __future__ import annotations

import signal
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.redis_io import RedisClient, Script
from runtime.redis_wire import if_all_succeeded
from runtime.testing.local_redis import RedisProcess
from tests.waiting import eventually

ECHO = Script("echo", "return {KEYS[1], ARGV[1]}")
SET = Script("set", "redis.call('SET', KEYS[1], ARGV[1]) return 1")
BUSY = Script(
    "busy",
    "local function now() local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 end "
    "local s = now() while now() - s < tonumber(ARGV[1]) do end return 1",
)


@pytest.fixture
def own_server() -> Iterator[RedisProcess]:
    """A server of this test alone, which it may kill or pause."""
    server = RedisProcess(find_server_binary()).start()
    yield server
    server.remove()


def client_for(url: str, **settings: object) -> RedisClient:
    return RedisClient.from_settings(url, RedisSection(url=url, **settings))  # type: ignore[arg-type]


@pytest.mark.parametrize("native_io", [True, False])
async def test_both_paths_answer_alike(redis_url: str, namespace: str, native_io: bool) -> None:
    client = client_for(redis_url, native_io=native_io)
    try:
        assert (client._native is not None) is native_io
        key = f"{namespace}:k"
        first, then = await client.scripts_in_order(
            [(SET, [key], ["1"])], if_all_succeeded([(ECHO, [key], ["v"])])
        )
        assert (first, then) == ([1], [[key.encode(), b"v"]])
        failing = Script("failing", "return redis.error_reply('no such thing')")
        first, then = await client.scripts_in_order(
            [(failing, [key], [])], if_all_succeeded([(SET, [key], ["2"])])
        )
        assert isinstance(first[0], Exception) and then == []
        assert await client.execute("GET", key) == b"1"  # ``then`` did not run
        await client.execute("SCRIPT", "FLUSH")
        assert await client.scripts(ECHO, [([key], ["w"])]) == [[key.encode(), b"w"]]
    finally:
        await client.aclose()


@pytest.mark.parametrize("native_io", [True, False])
async def test_then_sees_every_first_reply_before_a_transient_one_fails_the_call(
    redis_url: str, namespace: str, native_io: bool
) -> None:
    """A transient reply in the first round (a Cluster master failing over answers
    ``CLUSTERDOWN``) fails the call as an outage, but only after ``then`` has seen every
    reply: its caller learns which writes ran, so a repeat sends only the rest. No second
    round is sent."""
    client = client_for(redis_url, native_io=native_io)
    down = Script("down", "return redis.error_reply('CLUSTERDOWN The cluster is down')")
    a, b, second = f"{namespace}:a", f"{namespace}:b", f"{namespace}:second"
    seen: list[object] = []

    def then(replies: list[object]) -> list[tuple[Script, list[str], list[str]]]:
        seen.extend(replies)
        return [(SET, [second], ["1"])]

    try:
        with pytest.raises(RedisUnavailable, match="CLUSTERDOWN"):
            await client.scripts_in_order(
                [(SET, [a], ["1"]), (down, [a], []), (SET, [b], ["1"])], then
            )
        assert seen[0] == 1 and seen[2] == 1, seen
        assert isinstance(seen[1], RedisUnavailable) and "CLUSTERDOWN" in str(seen[1])
        assert not client.reachable  # an outage: actors wait for Redis, then repeat
        assert await client.execute("MGET", a, b, second) == [b"1", b"1", None]
        # Alone, a transient reply fails a call as before, with nothing in place.
        with pytest.raises(RedisUnavailable, match="CLUSTERDOWN"):
            await client.scripts(down, [([a], [])])
    finally:
        await client.aclose()


@pytest.mark.parametrize("native_io", [True, False])
async def test_a_refused_first_reply_is_no_outage(
    redis_url: str, namespace: str, native_io: bool
) -> None:
    """A refused reply in the first round (``OOM``) fails its own call only: ``then``
    picks the second round from the replies, and it is sent; Redis stays reachable."""
    client = client_for(redis_url, native_io=native_io)
    oom = Script("oom", "return redis.error_reply('OOM command not allowed when used memory')")
    a, second = f"{namespace}:a", f"{namespace}:second"
    try:
        first, then = await client.scripts_in_order(
            [(SET, [a], ["1"]), (oom, [a], [])],
            lambda replies: [(SET, [second], ["1"])] if replies[0] == 1 else [],
        )
        assert first[0] == 1 and isinstance(first[1], RedisRefused), first
        assert then == [1]
        assert client.reachable
        assert await client.execute("GET", second) == b"1"
    finally:
        await client.aclose()


@pytest.mark.parametrize("native_io", [True, False])
async def test_a_script_that_cannot_be_loaded_leaves_the_other_replies_to_then(
    redis_url: str, namespace: str, native_io: bool
) -> None:
    """A first round whose one script the server lacks and refuses to load (``SCRIPT
    LOAD`` denied by ACL): the calls that ran are still handed to ``then``, the one that
    could not run holds the refusal, and the second round is sent."""
    url = urllib.parse.urlsplit(redis_url)
    if url.scheme not in ("redis", "rediss") or url.port is None:
        pytest.skip("builds a TCP URL for a user of its own")
    user, password = f"u{namespace.replace(':', '')}", "pw"
    host = f"[{url.hostname}]" if ":" in (url.hostname or "") else url.hostname
    limited = url._replace(netloc=f"{user}:{password}@{host}:{url.port}").geturl()
    missing = Script("missing", f"return '{namespace}'")  # on no server yet
    a, second = f"{namespace}:a", f"{namespace}:second"
    admin = client_for(redis_url, native_io=False)
    client = client_for(limited, native_io=native_io)
    try:
        await admin.execute("ACL", "SETUSER", user, "on", f">{password}", "~*", "+@all", "-script")
        await admin.execute("SCRIPT", "LOAD", SET.source)
        first, then = await client.scripts_in_order(
            [(SET, [a], ["1"]), (missing, [a], [])],
            lambda replies: [(SET, [second], ["1"])] if replies[0] == 1 else [],
        )
        assert first[0] == 1 and isinstance(first[1], RedisRefused), first
        assert then == [1]
        assert await admin.execute("MGET", a, second) == [b"1", b"1"]
    finally:
        await client.aclose()
        try:
            await admin.execute("ACL", "DELUSER", user)
        finally:
            await admin.aclose()


async def test_a_unix_socket_takes_the_native_path(tmp_path: Path, namespace: str) -> None:
    sock = tmp_path / "r.sock"
    server = RedisProcess(find_server_binary(), ["--unixsocket", str(sock)]).start()
    try:
        client = client_for(f"unix://{sock}")
        assert client._native is not None
        assert await client.scripts(ECHO, [(["a"], ["b"])]) == [[b"a", b"b"]]
        await client.aclose()
    finally:
        server.remove()


async def test_a_restarted_server_behind_idle_connections_is_no_outage(
    own_server: RedisProcess,
) -> None:
    """The pooled connections die with the server; the next call goes on a new one."""
    client = client_for(own_server.url)
    try:
        assert await client.scripts(ECHO, [(["a"], ["1"])] * 3) == [[b"a", b"1"]] * 3
        own_server.kill()
        await trio.to_thread.run_sync(own_server.start, own_server.port)
        assert await client.scripts(ECHO, [(["b"], ["2"])]) == [[b"b", b"2"]]
    finally:
        await client.aclose()


async def test_a_stalled_server_is_an_outage_then_answers_again(
    own_server: RedisProcess, redis_url: str
) -> None:
    client = client_for(own_server.url, socket_timeout_s=0.3)
    admin = client_for(own_server.url, native_io=False)
    try:
        assert await client.scripts(ECHO, [(["a"], ["1"])]) == [[b"a", b"1"]]
        await admin.execute("CLIENT", "PAUSE", 1500, "ALL")
        with pytest.raises(RedisUnavailable, match="Timeout"):
            await client.scripts(ECHO, [(["a"], ["2"])])
        with trio.fail_after(30):
            while True:
                try:
                    assert await client.scripts(ECHO, [(["a"], ["3"])]) == [[b"a", b"3"]]
                    break
                except RedisUnavailable:
                    await trio.sleep(0.1)
    finally:
        await client.aclose()
        await admin.aclose()


async def test_cancelling_a_blocked_read_is_prompt(own_server: RedisProcess) -> None:
    client = client_for(own_server.url, socket_timeout_s=10)
    try:
        start = trio.current_time()
        with trio.move_on_after(0.2):
            await client.execute_unparsed("BLPOP", "never-pushed", 5)
        assert trio.current_time() - start < 2.0
        with trio.fail_after(10):  # the half-closed connection ends without the 5 s block
            await client.wait_abandoned()
        assert await client.scripts(ECHO, [(["a"], ["1"])]) == [[b"a", b"1"]]
    finally:
        await client.aclose()


async def test_an_abandoned_write_is_settled_once_wait_abandoned_returns(
    own_server: RedisProcess, namespace: str
) -> None:
    """A write sent to a paused server, its caller cancelled: once ``wait_abandoned``
    returns, the server has ended that connection, so the write has run or never will (a
    paused server drops it): the caller's next step cannot race it."""
    client = client_for(own_server.url, socket_timeout_s=10)
    admin = client_for(own_server.url, native_io=False)
    key = f"{namespace}:abandoned"
    try:
        await client.scripts(SET, [([f"{key}:warm"], ["0"])])  # loaded, a connection pooled
        await admin.execute("CLIENT", "PAUSE", 20_000, "WRITE")
        with trio.move_on_after(0.2) as scope:
            await client.scripts(SET, [([key], ["1"])])
        assert scope.cancelled_caught
        with trio.fail_after(30):
            await client.wait_abandoned()
        clients = await admin.execute("CLIENT", "LIST")
        assert clients.count(b"cmd=evalsha") == 0, clients  # the connection is gone
        await admin.execute("CLIENT", "UNPAUSE")
        assert await client.scripts(SET, [([f"{key}:after"], ["2"])]) == [1]
        assert await admin.execute("GET", key) is None  # dropped unrun, and stays so
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_loading_server_is_an_outage_until_its_data_is_in(namespace: str) -> None:
    """A server restarted with a large dataset answers ``-LOADING`` for a while: an outage
    (``RedisUnavailable``, as through redis-py), never a reply."""
    server = RedisProcess(find_server_binary(), ["--enable-debug-command", "yes"]).start()
    try:
        admin = client_for(server.url, native_io=False, socket_timeout_s=120)
        await admin.execute("DEBUG", "POPULATE", 3_000_000, namespace, 64)
        await admin.execute("SAVE")
        await admin.aclose()
        server.kill()
        await trio.to_thread.run_sync(server.start_without_ping)  # it loads the dump
        client = client_for(server.url)
        outages: list[RedisUnavailable] = []
        try:
            with trio.fail_after(120):
                while True:
                    try:
                        reply = await client.scripts(ECHO, [(["a"], ["1"])])
                        break
                    except RedisUnavailable as exc:
                        outages.append(exc)
                        await trio.sleep(0.01)
            assert reply == [[b"a", b"1"]]
            assert any("loading" in str(exc) for exc in outages), outages
        finally:
            await client.aclose()
    finally:
        server.remove()


@pytest.mark.parametrize("native_io", [True, False])
async def test_a_wrong_password_is_an_outage_on_both_paths(native_io: bool) -> None:
    server = RedisProcess(find_server_binary(), ["--requirepass", "right"]).start_without_ping()
    try:
        client = client_for(f"redis://:wrong@127.0.0.1:{server.port}/0", native_io=native_io)
        try:
            with pytest.raises(RedisUnavailable, match=r"(?i)password|auth"):
                await client.scripts(ECHO, [(["a"], ["1"])])
        finally:
            await client.aclose()
    finally:
        server.remove()


async def test_calls_abandoned_while_another_is_waited_for_are_each_settled(
    own_server: RedisProcess, namespace: str
) -> None:
    """A call abandoned while ``wait_abandoned`` reads an earlier one is waited for too,
    and each connection is read to its end once: none is left behind or read closed. (A
    server busy with a script reads neither until the script ends.)"""
    client = client_for(own_server.url, socket_timeout_s=10)
    admin = client_for(own_server.url, native_io=False)
    keys = [f"{namespace}:first", f"{namespace}:second"]
    try:
        await client.scripts(SET, [([f"{namespace}:warm"], ["0"])])
        settled: list[bool] = []

        async def wait() -> None:
            settled.append(await client.wait_abandoned())

        async with trio.open_nursery() as busy:
            busy.start_soon(admin.scripts, BUSY, [([], ["1500"])])
            await trio.sleep(0.2)  # the script runs
            with trio.move_on_after(0.2):
                await client.scripts(SET, [([keys[0]], ["1"])])
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                with trio.move_on_after(0.2):
                    await client.scripts(SET, [([keys[1]], ["2"])])
        assert settled == [True]
        assert client._native is not None and client._native._abandoned == []
        assert await client.scripts(SET, [([f"{namespace}:after"], ["3"])]) == [1]
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_call_too_large_for_a_stopped_servers_buffers_times_out(
    own_server: RedisProcess, namespace: str
) -> None:
    """A stopped server (SIGSTOP: a VM paused, a process frozen) reads nothing; a call
    larger than the sockets' buffers cannot be sent in full. It fails as an outage within
    the socket timeout, as through redis-py, rather than waiting for the server for good;
    once the server runs again, so do the calls."""
    client = client_for(own_server.url, socket_timeout_s=0.5)
    key = f"{namespace}:big"
    try:
        assert await client.scripts(SET, [([key], ["0"])]) == [1]
        assert own_server.process is not None
        own_server.process.send_signal(signal.SIGSTOP)
        try:
            with trio.fail_after(60), pytest.raises(RedisUnavailable, match="Timeout"):
                await client.scripts(SET, [([key], ["x" * (32 << 20)])])
        finally:
            own_server.process.send_signal(signal.SIGCONT)
        with trio.fail_after(30):
            while True:
                try:
                    assert await client.scripts(SET, [([f"{key}:after"], ["1"])]) == [1]
                    break
                except RedisUnavailable:
                    await trio.sleep(0.1)
    finally:
        await client.aclose()


@pytest.mark.parametrize("native_io", [True, False])
async def test_a_demoted_server_is_left_for_whatever_its_address_names_next(
    own_server: RedisProcess, native_io: bool, namespace: str
) -> None:
    """The server behind the URL becomes a replica (a failover that moves a DNS name to
    the new primary leaves the old one answering at its address): its ``READONLY`` reply
    is an outage, and the connections that met it are closed, so the next call connects
    anew (to the new primary, once the name points there) instead of writing to the
    replica for good."""
    primary = RedisProcess(find_server_binary()).start()
    client = client_for(own_server.url, native_io=native_io)
    admin = client_for(own_server.url, native_io=False)
    key = f"{namespace}:k"
    try:
        assert await client.scripts(SET, [([key], ["1"])]) == [1]
        assert await client.execute("GET", key) == b"1"
        before = await _client_ids(admin)
        await admin.execute("REPLICAOF", "127.0.0.1", primary.port)
        with pytest.raises(RedisUnavailable, match="READONLY"):
            await client.scripts(SET, [([key], ["2"])])

        async def old_ones_closed() -> bool:
            return not before & await _client_ids(admin)

        await eventually(old_ones_closed, what="the connections to the replica closed")
    finally:
        await client.aclose()
        await admin.aclose()
        primary.remove()


async def _client_ids(admin: RedisClient) -> set[bytes]:
    """The ids of the server's connections but ``admin``'s own."""
    own = await admin.execute("CLIENT", "ID")
    listed = await admin.execute("CLIENT", "LIST")
    ids = {line.split(b" ", 1)[0].removeprefix(b"id=") for line in listed.splitlines()}
    return ids - {str(own).encode()}
