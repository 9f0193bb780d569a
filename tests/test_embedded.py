"""The embedded Redis server is owned for life by its node: real processes, real SIGKILL."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import redis

from runtime.testing.local_redis import free_port
from tests.node_process import NodeProcess, alive


def embedded_config(tmp_path: Path, name: str, data: Path, port: int) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'namespace = "embedded-test"\n[node]\nname = "{name}"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "embedded"\ndata_dir = "{data}"\nembedded_port = {port}\n'
    )
    return path


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
            client = redis.Redis(unix_socket_path=str(data / "redis.sock"))
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
