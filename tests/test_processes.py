"""One node, several processes (``[processes]``): real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import trio

from actors.admin.client import Client
from actors.api.signing import sign
from actors.domain.api_keys import ApiKey
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.keys import GROUP
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from runtime.version import __version__
from tests.api_node import ADMIN
from tests.execution_harness import records, wait_records
from tests.node_process import REPO, NodeProcess, alive
from tests.waiting import settled, until


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


def write_config(
    tmp_path: Path, redis_url: str, namespace: str, *, processes: str, grace_s: float = 5.0,
    handler: str = "noop", extra: str = "",
) -> Path:  # fmt: skip
    path = tmp_path / "node.toml"
    path.write_text(
        f'namespace = "{namespace}"\n'
        f'[node]\nname = "n1"\nshutdown_grace_s = {grace_s}\n'
        f'[redis]\nurl = "{redis_url}"\n'
        "[scheduler]\npartitions = 4\nmax_tick_s = 0.05\n"
        f'[execution]\nresults_log = "{tmp_path / "results.jsonl"}"\n'
        "claimer_interval_s = 0.2\n"
        f'[consumers.work]\nhandler = "tests.handlers.jobs:{handler}"\n'
        "concurrency = 4\nlease_s = 2\nbackoff_base_s = 0.1\n"
        f"[processes]\n{processes}\n{extra}"
    )
    return path


def api_section(port: int) -> str:
    key = f'[[api.keys]]\nid = "{ADMIN[0]}"\nsecret = "{ADMIN[1]}"\n'
    return f'[api]\nbind = "127.0.0.1:{port}"\n{key}'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def children(node: NodeProcess) -> dict[str, int]:
    """Each part's pid as the main process last started it."""
    return {e["actor"].rsplit("/", 1)[1]: e["pid"] for e in node.events("process_started")}


def ran_records(record: Path) -> list[dict[str, Any]]:
    return [r for r in records(record) if r["event"] == "ran"]


def ran_by(found: list[dict[str, Any]], pid: int) -> bool:
    return any(r["event"] == "ran" and r["pid"] == pid for r in found)


def start_logging_to(log: Path, config: Path) -> subprocess.Popen[bytes]:
    """A node whose stdout is the file ``log``, as ``python -m runtime node.toml >> log``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("ab") as out:  # the node keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "runtime", str(config)], stdout=out, cwd=REPO, env=env
        )


def wait_gone(pids: list[int], timeout_s: float) -> None:
    until(lambda: not any(alive(p) for p in pids), timeout_s, what=f"{pids} all gone")


async def test_parts_run_in_child_processes_and_stop_with_the_node(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str, record: Path
) -> None:
    """Scheduler and two consumer processes: fires are enqueued by the scheduler process,
    run by both consumer processes (two consumers in the group), and SIGTERM to the node
    stops every process gracefully with status 0."""
    config = write_config(tmp_path, redis_url, namespace, processes="scheduler = 1\nconsumers = 2")
    await store.create_many(
        [TaskSpec("work", Schedule("interval", every_s=0.2)) for _ in range(20)]
    )
    node = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready", 2)
        pids = children(node)
        assert set(pids) == {"scheduler", "consumers-1", "consumers-2"}
        two_pids = lambda r: len({e["pid"] for e in r if e["event"] == "ran"}) == 2  # noqa: E731
        await wait_records(record, two_pids, timeout_s=20)
        node.signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(node.wait) == 0
        wait_gone(list(pids.values()), 5)
    finally:
        await trio.to_thread.run_sync(node.kill)
    ran_by = {r["pid"] for r in records(record) if r["event"] == "ran"}
    assert ran_by == {pids["consumers-1"], pids["consumers-2"]}
    # Lines of every process reach the node's stdout whole, each naming its part.
    assert len(node.lines) == len(node.raw)
    stopped = {e["node"] for e in node.events("node_stopped")}
    assert stopped == {"n1", "n1/scheduler", "n1/consumers-1", "n1/consumers-2"}
    assert {e["node"] for e in node.events("poller_ready")} == {"n1/scheduler"}
    finished = node.events("finished")
    assert {e["node"] for e in finished} <= {"n1/consumers-1", "n1/consumers-2"}
    assert {e["actor"] for e in finished} == {"node/consumers/work/consumer"}
    assert [e["asked"] for e in node.events("process_exited")] == [True, True, True]
    assert not node.events("process_killed")
    assert "shutdown_forced" not in {e["event"] for e in node.events()}
    # Drained before their supervisor's turn to stop them: not restarted meanwhile.
    assert not node.events("actor_restarting") and len(node.events("process_started")) == 3


def _node_writing_to_a_pipe(config: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", str(config)], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, cwd=REPO, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("processes", ["", "consumers = 1"])
async def test_a_node_whose_log_reader_goes_away_keeps_firing(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str, record: Path,
    processes: str,
) -> None:  # fmt: skip
    """The node's stdout is a pipe whose reader goes away (a log shipper that died): its
    lines are dropped, its fires go on running, and it stops cleanly; a write that failed
    raised into the actor logging it, up to the root (exit 1)."""
    config = write_config(tmp_path, redis_url, namespace, processes=processes)
    await store.create_many([TaskSpec("work", Schedule("interval", every_s=0.2))])
    node = _node_writing_to_a_pipe(config)
    try:
        assert node.stdout is not None
        assert b"node_started" in await trio.to_thread.run_sync(node.stdout.readline)
        await wait_records(record, lambda r: len(r) >= 2, timeout_s=20)
        node.stdout.close()  # the reader goes away
        ran = len(records(record))
        await wait_records(record, lambda r: len(r) >= ran + 10, timeout_s=20)
        assert node.poll() is None
        node.send_signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(lambda: node.wait(30)) == 0
    finally:
        node.kill()
        node.wait()


async def test_a_killed_child_is_restarted_alone_and_loses_no_fire(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str, record: Path
) -> None:
    """kill -9 one consumer process: the node restarts that process only (the other
    processes keep their pids) and every fire due in the window runs."""
    config = write_config(tmp_path, redis_url, namespace, processes="scheduler = 1\nconsumers = 2")
    start_ms = await store.now_ms() + 1500
    schedule = Schedule("interval", every_s=0.3, start_ms=start_ms, misfire="fire_all")
    ids = [c.task_id for c in await store.create_many([TaskSpec("work", schedule)] * 6)]
    node = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready", 2)
        before = children(node)
        await wait_records(record, lambda rs: ran_by(rs, before["consumers-1"]))  # at work
        os.kill(before["consumers-1"], signal.SIGKILL)
        await trio.to_thread.run_sync(node.wait_for, "actor_restarted")
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready", 3)
        after = children(node)
        # Past the lease (2 s): the dead process's messages run again.
        window_end = await store.now_ms() + 2000
        expected = {f"{t}:{due}" for t in ids for due in range(start_ms, window_end, 300)}
        await settled(lambda: expected <= {r["schedule_id"] for r in ran_records(record)})
        node.signal(signal.SIGTERM)
        assert await trio.to_thread.run_sync(node.wait) == 0
    finally:
        await trio.to_thread.run_sync(node.kill)
    assert after["consumers-1"] != before["consumers-1"]
    assert after["consumers-2"] == before["consumers-2"]
    assert after["scheduler"] == before["scheduler"]
    crashed = node.events("actor_crashed")
    assert [e["actor"] for e in crashed] == ["node/processes/consumers-1"]
    ran = Counter(r["schedule_id"] for r in ran_records(record))
    assert len(expected) >= 30
    missing = expected - set(ran)
    assert not missing, f"{len(missing)} fires never ran, e.g. {sorted(missing)[:3]}"


async def test_children_stop_when_the_node_is_killed(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str, record: Path, db: Any
) -> None:
    """SIGKILL the main process: its children see their stdin end and stop gracefully
    instead of running on as orphans. Their lines went through the node, so the proof of
    a graceful stop is what they did: the handler running at the kill finished and its
    message was acknowledged, which a killed consumer cannot do."""
    config = write_config(
        tmp_path, redis_url, namespace, processes="scheduler = 1\nconsumers = 1",
        handler="sleepy",
    )  # fmt: skip
    await store.create_many([TaskSpec("work", Schedule("once", at_ms=0), {"sleep_s": 1.5})])
    node = NodeProcess(config)
    pids: list[int] = []
    try:
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready")
        pids = list(children(node).values())
        await wait_records(record, lambda r: any(e["event"] == "started" for e in r), 20)
        node.signal(signal.SIGKILL)
        await trio.to_thread.run_sync(wait_gone, pids, 8)
    finally:
        await trio.to_thread.run_sync(node.kill)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert [r["event"] for r in records(record)] == ["started", "ran"]
    assert db.xpending(f"{{{namespace}:q:work}}:queue", GROUP)["pending"] == 0


async def test_children_write_whole_lines_to_a_log_file_and_outlive_a_killed_node_there(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """With the node's stdout a file it appends to, its children write their lines there
    themselves: busy processes (a line per fire from the consumer and, at debug, from the
    scheduler) leave only whole lines, and a child's last lines, written after the node
    was killed (which would have ended a relay), are in the file too."""
    config = write_config(
        tmp_path, redis_url, namespace, processes="scheduler = 1\nconsumers = 1",
        extra='[log]\nlevel = "debug"\n',
    )  # fmt: skip
    await store.create_many(
        [TaskSpec("work", Schedule("interval", every_s=0.1)) for _ in range(100)]
    )
    log = tmp_path / "node.log"
    proc = start_logging_to(log, config)
    pids: list[int] = []

    def lines() -> list[str]:  # whole ones: a write may be under way
        text = log.read_text()
        return text[: text.rfind("\n") + 1].splitlines()

    def events(event: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in lines() if f'"event":"{event}"' in x]

    def busy() -> None:
        until(lambda: len(events("finished")) >= 2_000, 60, what="2,000 finished lines")

    try:
        await trio.to_thread.run_sync(busy)
        pids = [e["pid"] for e in events("process_started")]
        proc.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(proc.wait, 10)
        await trio.to_thread.run_sync(wait_gone, pids, 15)
    finally:
        proc.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert text.endswith("\n")
    assert all(json.loads(line)["event"] for line in text.splitlines())  # every line whole
    stopped = {e["node"] for e in events("node_stopped")}
    assert stopped == {"n1/scheduler", "n1/consumers-1"}  # the node itself was killed
    assert events("scheduled") and events("finished")


def test_a_child_ignores_sigint_and_repeated_sigterm(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """Only the parent decides when a child's stop becomes immediate: SIGINT (a terminal's
    Ctrl-C reaches the whole group) is ignored, and a second SIGTERM (systemd signals every
    process of the unit) does not cut the child's graceful stop short."""
    config = write_config(
        tmp_path, redis_url, namespace, processes="consumers = 1", handler="sleepy"
    )
    node = NodeProcess(config)
    try:
        node.wait_for("consumer_ready")
        child = children(node)["consumers-1"]
        os.kill(child, signal.SIGINT)
        time.sleep(0.5)
        assert alive(child)
        os.kill(child, signal.SIGTERM)
        os.kill(child, signal.SIGTERM)
        node.wait_for("node_stopped")
        # The child exited 0 on a stop it was not asked for by the node: a normal exit,
        # and the node restarts it (permanent).
        node.wait_for("process_started", 2)
        node.wait_for("consumer_ready", 2)
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    child_lines = [e for e in node.events() if e["node"] == "n1/consumers-1"]
    assert [e["event"] for e in child_lines].count("shutdown_requested") == 2  # two runs
    assert "shutdown_immediate" not in {e["event"] for e in node.events()}


@pytest.mark.parametrize(
    ("processes", "extra", "message"),
    [
        ("api = 1", "", "processes.api: needs an [api] section"),
        ("consumers = 65", "", "processes.consumers: must be within 0..64"),
        ("scheduler = 2", "", "processes.scheduler: must be within 0..1"),
    ],
)
def test_bad_processes_config_is_named(
    tmp_path: Path, redis_url: str, namespace: str, processes: str, extra: str, message: str
) -> None:
    config = write_config(tmp_path, redis_url, namespace, processes=processes, extra=extra)
    done = subprocess.run(
        [sys.executable, "-m", "runtime", str(config), "--check"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_a_bad_handler_fails_the_main_process_not_a_child(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """A handler the consumer processes could not import is a config error of the node,
    before any child starts, not a crash loop of children."""
    config = write_config(
        tmp_path, redis_url, namespace, processes="consumers = 2", handler="missing"
    )
    node = NodeProcess(config)
    assert node.wait(timeout_s=30) == 2
    assert "consumers.work.handler: 'tests.handlers.jobs' has no 'missing'" in node.stderr_text()
    assert not node.events("process_started")


def test_unknown_part_is_refused(tmp_path: Path, redis_url: str, namespace: str) -> None:
    config = write_config(tmp_path, redis_url, namespace, processes="consumers = 1")
    done = subprocess.run(
        [sys.executable, "-m", "runtime", str(config), "--part", "consumers-2", "--check"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--part 'consumers-2': not a part of this node's [processes]" in done.stderr


def test_embedded_redis_is_shared_by_the_children(tmp_path: Path) -> None:
    """With the embedded server, the main process runs it and the children use it."""
    config = tmp_path / "node.toml"
    config.write_text(
        f'[node]\nname = "n1"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "embedded"\ndata_dir = "{tmp_path / "data"}"\n'
        f'[execution]\nresults_log = "{tmp_path / "results.jsonl"}"\n'
        '[consumers.work]\nhandler = "tests.handlers.jobs:noop"\n'
        "[processes]\nscheduler = 1\nconsumers = 1\n"
    )
    node = NodeProcess(config)
    try:
        node.wait_for("consumer_ready")
        node.wait_for("poller_ready")
        client = redis.Redis(unix_socket_path=str(tmp_path / "data" / "redis.sock"))
        clients = len(client.client_list())
        client.close()
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    assert clients >= 3  # this test's, the scheduler process's and the consumer process's
    assert not node.events("actor_crashed")
    assert node.events("redis_stopped") or node.events("node_stopped")


def test_api_processes_share_one_port(tmp_path: Path, redis_url: str, namespace: str) -> None:
    """``api = 2``: two processes serve the one port (SO_REUSEPORT); the kernel gives new
    connections to both, and each request is answered whole by one of them."""
    port = free_port()
    config = write_config(
        tmp_path, redis_url, namespace, processes="api = 2", extra=api_section(port)
    )
    node = NodeProcess(config)
    try:
        node.wait_for("api_listening", 2)
        for i in range(24):  # a fresh connection each: the kernel picks a process per one
            with Client(f"http://127.0.0.1:{port}", *ADMIN) as client:
                created = client.create_task("work", {"kind": "once", "at_ms": 0}, {"i": i})
                assert client.get_task(created["task_id"])["payload"] == {"i": i}
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    served_by = Counter(e["node"] for e in node.events("api_request"))
    assert set(served_by) == {"n1/api-1", "n1/api-2"}
    assert not node.events("api_error")


def test_api_processes_need_a_fixed_port(tmp_path: Path, redis_url: str, namespace: str) -> None:
    config = write_config(tmp_path, redis_url, namespace, processes="api = 2", extra=api_section(0))
    done = subprocess.run(
        [sys.executable, "-m", "runtime", str(config), "--check"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "processes.api: several API processes share one port: set api.bind" in done.stderr


def signed_probe() -> dict[str, str]:
    """/readyz names the actors that are down only to a signed request."""
    key = ApiKey(ADMIN[0], ADMIN[1].encode())
    return sign(key, "GET", "/readyz", b"", int(time.time() * 1000))


def test_an_api_process_reports_the_whole_node_in_readyz(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """The API runs in a child process: when another part of the node dies, that child's
    /readyz says so (the node sends each child what is down in the main process) until the
    node has restarted it."""
    port = free_port()
    config = write_config(
        tmp_path, redis_url, namespace, processes="consumers = 1\napi = 1", extra=api_section(port)
    )
    node = NodeProcess(config)
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        node.wait_for("api_listening")
        node.wait_for("consumer_ready")
        ready = httpx.get(url, headers=signed_probe()).json()
        assert ready == {"ready": True, "redis": True, "version": __version__, "actors_down": {}}
        killed = children(node)["consumers-1"]
        os.kill(killed, signal.SIGKILL)
        kills = 1
        seen = []
        deadline = time.monotonic() + 60  # generous: a loaded machine notices late
        with httpx.Client() as http:
            while time.monotonic() < deadline:
                answer = http.get(url, headers=signed_probe())
                seen.append((answer.status_code, answer.json()["actors_down"]))
                if seen[-1][0] == 200 and len(seen) > 1 and seen[-2][0] == 503:
                    break  # down, then ready again after the restart
                # No pause: the restart's backoff (0.1 s, doubling with each restart in a
                # row) is the window to see it in. Restarted unseen (a loaded machine):
                # killed again, at most three times in all (the intensity allows three).
                restarted = children(node)["consumers-1"]
                if restarted != killed and 503 not in {c for c, _ in seen} and kills < 3:
                    killed, kills = restarted, kills + 1
                    os.kill(killed, signal.SIGKILL)
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()
    assert any(  # crashed, exited, or starting again: down in some form while it restarts
        code == 503 and any(path.startswith("node/processes/consumers-1") for path in down)
        for code, down in seen
    ), seen
    assert seen[-1] == (200, {})


def test_the_node_is_not_ready_before_its_consumer_process_is(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """A consumer process counted as started from its fork, still importing its handlers
    and starting its actors, and the node's /readyz said 200 seconds before that (and a
    fraction of a second after a kill, while the new one was): each child reports whether
    its tree has started and what is down in it, and the node is ready only once it has
    (its last actor started, as in a one-process node)."""
    port = free_port()
    config = write_config(
        tmp_path, redis_url, namespace, processes="consumers = 1", extra=api_section(port)
    )
    node = NodeProcess(config)
    url = f"http://127.0.0.1:{port}/readyz"

    def child_started(count: int) -> dict[str, Any]:
        """The ``count``-th start of the consumer process's last actor (its tree is up)."""
        until(lambda: len(last_started()) >= count, 60, what="the child's tree started")
        return last_started()[count - 1]

    def last_started() -> list[dict[str, Any]]:
        return [
            e for e in node.events("actor_started")
            if e["node"] == "n1/consumers-1" and e["actor"] == "node/metrics-writer"
        ]  # fmt: skip

    def first_ready_ms(http: httpx.Client) -> tuple[int, list[Any]]:
        """When /readyz first answers 200 (ms), and what it answered before."""
        seen: list[Any] = []
        deadline = time.monotonic() + 60  # generous: a loaded machine starts slowly
        while time.monotonic() < deadline:
            try:
                answer = http.get(url, headers=signed_probe())
            except httpx.TransportError:  # not listening yet
                continue
            if answer.status_code == 200:
                return int(time.time() * 1000), seen
            seen.append(answer.json()["actors_down"])
        raise AssertionError(f"never ready: {seen[-3:]}")

    try:
        with httpx.Client() as http:
            ready_ms, _ = first_ready_ms(http)
            assert child_started(1)["ts_ms"] <= ready_ms  # not before the child's tree was
            os.kill(children(node)["consumers-1"], signal.SIGKILL)
            until(lambda: http.get(url).status_code == 503, 30, what="not ready after a kill")
            ready_ms, seen = first_ready_ms(http)
            assert child_started(2)["ts_ms"] <= ready_ms, seen
        node.signal(signal.SIGTERM)
        assert node.wait() == 0
    finally:
        node.kill()


def test_a_hangup_stops_the_node_and_its_children_gracefully(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """SIGHUP to the node's process group (a terminal's hangup: an SSH session closed on a
    node started without nohup) killed every process at once, no drain, no release: the
    node stops gracefully, as on SIGTERM, and its children wait for it to relay the stop."""
    config = write_config(tmp_path, redis_url, namespace, processes="consumers = 1")
    node = NodeProcess(config, own_group=True)
    try:
        node.wait_for("consumer_ready")
        node.signal_group(signal.SIGHUP)
        assert node.wait() == 0
    finally:
        node.kill()
    (asked,) = [e for e in node.events("shutdown_requested") if e["node"] == "n1"]
    assert asked["signal"] == "SIGHUP"
    child_lines = [e["event"] for e in node.events() if e["node"] == "n1/consumers-1"]
    assert "consumer_stopped" in child_lines and child_lines[-1] == "node_stopped"
