"""The embedded Redis server is owned for life by its node: real processes, real SIGKILL;
a TCP port only with its password; a large dataset is waited for while it loads."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import redis
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import free_port
from tests.node_process import NodeProcess, alive
from tests.waiting import until


def embedded_config(
    tmp_path: Path, name: str, data: Path, port: int, redis_extra: str = "", extra: str = ""
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'namespace = "embedded-test"\n[node]\nname = "{name}"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "embedded"\ndata_dir = "{data}"\nembedded_port = {port}\n'
        f"{redis_extra}{extra}"
    )
    return path


def socket_client(data: Path) -> redis.Redis:
    """A client on the server's socket, with its password when it has one (a TCP port)."""
    password_file = data / "redis.password"
    password = password_file.read_text().strip() if password_file.exists() else None
    return redis.Redis(unix_socket_path=str(data / "redis.sock"), password=password)


def wait_gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_killed_node_takes_its_server_along_and_restarts_cleanly_ten_times(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    config = embedded_config(tmp_path, "n1", data, free_port())
    for attempt in range(10):
        node = NodeProcess(config)
        try:
            ready = node.wait_for("embedded_redis_ready")[0]
            node.wait_for("poller_ready")
            client = socket_client(data)
            if attempt == 0:
                client.set("survives", "yes")
            assert client.get("survives") == b"yes"  # the same data, every time
            client.close()
            node.signal(signal.SIGKILL)
            assert node.wait() == -signal.SIGKILL
            assert wait_gone(ready["pid"]), f"redis-server {ready['pid']} outlived its node"
        finally:
            node.kill()
    assert not any(e["event"] == "actor_crashed" for e in node.events())


def test_a_crashed_server_restarts_alone_and_the_node_fires_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded server killed (SIGKILL): the node starts it again, alone; the poller
    and the consumers ride the outage out as for any Redis (none is stopped and started
    again, which drained each type's handlers while the server stayed down), and the
    fires go on."""
    data = tmp_path / "data"
    record = tmp_path / "handled.jsonl"
    monkeypatch.setenv("METRONOME_TEST_RECORD", str(record))
    consumers = (
        "[scheduler]\npartitions = 4\nmax_tick_s = 0.05\n"
        '[consumers.work]\nhandler = "tests.handlers.jobs:noop"\n'
    )
    config = embedded_config(tmp_path, "n1", data, free_port(), extra=consumers)
    node = NodeProcess(config)
    try:
        ready = node.wait_for("embedded_redis_ready")[0]
        node.wait_for("consumer_ready")
        password = (data / "redis.password").read_text().strip()
        trio.run(_every_second, f"unix://:{password}@{data.resolve() / 'redis.sock'}")

        def runs() -> int:
            return len(record.read_text().splitlines()) if record.exists() else 0

        until(lambda: runs() >= 2, 30)
        os.kill(ready["pid"], signal.SIGKILL)
        node.wait_for("embedded_redis_ready", 2)
        ran = runs()
        until(lambda: runs() >= ran + 3, 60)  # fires go on after the server is back
        assert len(node.events("poller_ready")) == 1 and len(node.events("consumer_ready")) == 1
        restarting = {e["actor"] for e in node.events("actor_restarting")}
        assert restarting == {"node/redis"}, restarting
    finally:
        node.signal(signal.SIGTERM)
        assert node.wait() == 0


async def _every_second(url: str) -> None:
    """A task of type ``work`` due every second, created on the server at ``url``."""
    client = RedisClient.from_settings(url, RedisSection(url=url))
    try:
        await TaskStore(client, "embedded-test").create(
            TaskSpec("work", Schedule("interval", every_s=1))
        )
    finally:
        await client.aclose()


def test_ctrl_c_at_a_terminal_stops_the_node_before_its_server(tmp_path: Path) -> None:
    """Ctrl-C signals the whole foreground process group. The embedded server is in a
    group of its own, so it keeps serving while the node stops its actors, and the node
    stops it last: a clean exit within the grace, not a forced shutdown."""
    data = tmp_path / "data"
    node = NodeProcess(embedded_config(tmp_path, "n1", data, free_port()), own_group=True)
    try:
        server = node.wait_for("embedded_redis_ready")[0]["pid"]
        node.wait_for("poller_ready")
        node.signal_group(signal.SIGINT)
        assert node.wait() == 0
        assert wait_gone(server), f"redis-server {server} outlived its node"
    finally:
        node.kill()
    assert not node.events("shutdown_forced"), node.raw[-20:]
    assert not node.events("actor_crashed"), node.raw[-20:]
    log = (data / "redis.log").read_text()
    assert "Received SIGTERM" in log and "SIGINT" not in log  # stopped by its node, last


def test_a_second_node_on_the_same_data_dir_refuses_and_leaves_the_first_alone(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first = NodeProcess(embedded_config(tmp_path, "a", data, 0))
    try:
        ready = first.wait_for("embedded_redis_ready")[0]
        second = NodeProcess(embedded_config(tmp_path, "b", data, 0))
        assert second.wait() == 1
        err = second.stderr_text().strip().splitlines()
        assert len(err) == 1 and "is in use by another Metronome node" in err[0], err
        assert f"pid {first.proc.pid}" in err[0]
        # The first node's server and its socket are untouched.
        client = redis.Redis(unix_socket_path=str(data / "redis.sock"))
        assert client.ping()
        client.close()
        assert alive(ready["pid"])
        first.signal(signal.SIGTERM)
        assert first.wait() == 0
    finally:
        first.kill()


def test_with_a_tcp_port_only_clients_with_the_password_get_in(tmp_path: Path) -> None:
    """Every local user can reach a TCP port: the server wants the password kept in the
    data dir (0600), which the node's processes use (the scheduler runs in a child process
    here) and an operator reads; it is on no command line and in no log line."""
    data = tmp_path / "data"
    port = free_port()
    node = NodeProcess(
        embedded_config(tmp_path, "n1", data, port, extra="[processes]\nscheduler = 1\n")
    )
    try:
        ready = node.wait_for("embedded_redis_ready")[0]
        node.wait_for("poller_ready")  # the child process got in with the password
        password_file = (data / "redis.password").resolve()
        assert ready["password_file"] == str(password_file)
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        password = password_file.read_text().strip()
        assert _unauthenticated_ping(port).startswith(b"-NOAUTH")
        operator = redis.Redis(host="127.0.0.1", port=port, password=password)
        assert operator.hget("embedded-test:meta", "partitions") == b"16"  # the node's
        operator.close()
        client = socket_client(data)  # the socket: the same password
        assert client.ping()
        client.close()
        assert password not in Path(f"/proc/{ready['pid']}/cmdline").read_text()
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    assert not node.events("actor_crashed"), node.raw[-20:]
    assert not [line for line in node.raw if password in line]


#: Keys in the dataset that loads slowly, and how long each takes to load (µs).
KEYS = 2000
KEY_LOAD_DELAY_US = 1000


def test_a_server_loading_a_large_dataset_is_waited_for_with_progress_lines(
    tmp_path: Path,
) -> None:
    """Loading takes as long as the data needs: the server answers LOADING meanwhile, the
    node says how far it is (``redis_loading``) and starts its actors once it is done. The
    server here loads each key slowly (its own ``key-load-delay`` setting), with a TCP port,
    so the wait goes through the password too."""
    data = tmp_path / "data"
    _write_aof(data, KEYS)
    slow = tmp_path / "slow-redis-server"
    slow.write_text(
        f"#!/bin/sh\nexec {find_server_binary()} --key-load-delay {KEY_LOAD_DELAY_US} "
        '--loading-process-events-interval-bytes 1024 "$@"\n'
    )
    slow.chmod(0o755)
    config = embedded_config(
        tmp_path, "n1", data, free_port(), redis_extra=f'server_binary = "{slow}"\n'
    )
    node = NodeProcess(config)
    try:
        loading = node.wait_for("redis_loading")[0]
        node.wait_for("embedded_redis_ready")
        node.wait_for("poller_ready")
        client = socket_client(data)
        assert client.dbsize() >= KEYS  # everything loaded, and the node's own keys
        client.close()
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    assert 0 <= loading["loaded_perc"] < 100, loading
    assert not node.events("actor_crashed"), node.raw[-20:]


def _write_aof(data: Path, keys: int) -> None:
    """A data dir as the embedded server leaves it (AOF, its base an RDB), holding
    ``keys`` keys."""
    data.mkdir()
    filler = data / "filler.sock"
    server = subprocess.Popen(
        [
            find_server_binary(), "--port", "0", "--unixsocket", str(filler),
            "--dir", str(data), "--appendonly", "yes", "--save", "", "--logfile", "filler.log",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(unix_socket_path=str(filler))
    try:
        deadline = time.monotonic() + 30
        while not filler.exists():
            assert time.monotonic() < deadline, "the filler server never listened"
            time.sleep(0.02)
        pipe = client.pipeline(transaction=False)
        for i in range(keys):
            pipe.set(f"k{i}", "x" * 100)
        pipe.execute()
        client.bgrewriteaof()  # the keys go into the RDB base
        while _rewriting(client):
            assert time.monotonic() < deadline, "the AOF rewrite never ended"
            time.sleep(0.05)
    finally:
        client.close()
        server.terminate()
        server.wait()


def _rewriting(client: redis.Redis) -> bool:
    info = client.info("persistence")
    return bool(info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"])


def _unauthenticated_ping(port: int) -> bytes:
    """What the server answers a PING from a client that gives no password."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(1024)


def test_a_snapshot_put_in_an_empty_data_dir_is_restored_and_kept(tmp_path: Path) -> None:
    """The backup restore: a snapshot (``dump.rdb``) put in place of the data dir. With
    the AOF on, the server started empty beside it and the node wrote on (every task
    lost, and later starts never read the snapshot): the node loads it, writes its AOF
    from it, and moves it aside; the next start reads the AOF. A data dir made here is
    the node's user's alone."""
    data = tmp_path / "data"
    config = embedded_config(tmp_path, "n1", data, 0)
    node = NodeProcess(config)
    try:
        node.wait_for("embedded_redis_ready")
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        client = socket_client(data)
        client.set("kept", "from the backup")
        client.save()  # dump.rdb in the data dir: the snapshot a backup takes
        client.close()
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    restored = tmp_path / "restored"
    restored.mkdir()
    (data / "dump.rdb").rename(restored / "dump.rdb")
    config = embedded_config(tmp_path, "n2", restored, 0)
    for start in range(2):  # the restore, then a start from the AOF it wrote
        node = NodeProcess(config)
        try:
            node.wait_for("embedded_redis_ready")
            client = socket_client(restored)
            assert client.get("kept") == b"from the backup", start
            client.close()
            node.signal(signal.SIGTERM)
            assert node.wait() == 0
        finally:
            node.kill()
        assert len(node.events("embedded_redis_restored")) == (1 if start == 0 else 0)
    assert (restored / "dump.rdb.restored").exists() and not (restored / "dump.rdb").exists()


def test_a_data_dir_that_cannot_be_made_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    config = embedded_config(tmp_path, "n1", tmp_path / "afile" / "data", 0)
    node = NodeProcess(config)
    try:
        assert node.wait(timeout_s=60) == 1
    finally:
        node.kill()
    err = node.stderr_text()
    assert "cannot start: [redis] data_dir" in err and "Traceback" not in err, err
