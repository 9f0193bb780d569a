"""Redis going away under a running node: killed and restarted from its AOF, or stalled.
Real processes, real signals; "nothing lost" is counted from what the handlers recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.lowlevel

from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.logging import get_logger
from runtime.redis_io import RedisClient
from runtime.supervisor import ChildSpec, supervisor
from runtime.testing.local_redis import RedisProcess
from tests.execution_harness import (
    fault_node_toml,
    fault_under_a_running_node,
    periodic_tasks,
)
from tests.node_process import NodeProcess
from tests.waiting import eventually


@pytest.fixture
def aof_server() -> Iterator[RedisProcess]:
    """A Redis of this test's own, persisting to an AOF as production would."""
    server = RedisProcess(
        find_server_binary(), ["--appendonly", "yes", "--appendfsync", "everysec"]
    ).start()
    try:
        yield server
    finally:
        server.remove()


def client_for(url: str) -> RedisClient:
    settings = RedisSection(url=url, connect_timeout_s=0.3, socket_timeout_s=0.5)
    return RedisClient.from_settings(url, settings)


# redis-py can drop a socket it opened while the server was coming back (inside its own
# reconnect check) without closing it; that is its leak, not a hang or a lost call.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_actor_rides_out_a_redis_restart_without_crashing(
    aof_server: RedisProcess,
) -> None:
    client = client_for(aof_server.url)
    pings: list[float] = []

    async def pinger(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        while True:
            await client.ride_out(client.ping)
            pings.append(trio.current_time())
            await trio.sleep(0.02)

    tree = supervisor("sup", [ChildSpec("pinger", pinger)])
    ctx = ActorContext("node", 1.0, get_logger(actor="node"))
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(tree.run, ctx)
            await trio.sleep(0.2)
            aof_server.kill()
            await eventually(lambda: not client.reachable, what="the outage noticed")
            await trio.sleep(1.0)  # the outage
            down_at = len(pings)
            await trio.to_thread.run_sync(aof_server.start, aof_server.port)
            await eventually(lambda: len(pings) > down_at + 5, what="pings after the restart")
            ctx.stop_requested.value = True
    events = [e["event"] for e in logs]
    assert "actor_crashed" not in events and "actor_restarted" not in events
    assert events.count("redis_unreachable") == 1 and events.count("redis_reachable") == 1
    (back,) = [e for e in logs if e["event"] == "redis_reachable"]
    assert back["outage_s"] >= 1.0
    await client.aclose()


def node_config(tmp_path: Path, url: str, namespace: str) -> Path:
    return fault_node_toml(tmp_path, url, namespace)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_node_rides_out_redis_killed_and_restarted_from_its_aof(
    aof_server: RedisProcess, tmp_path: Path, record: Path
) -> None:
    """SIGKILL Redis under a running node, bring it back 3 s later from its AOF: the node
    never exits, says when Redis went and came back, and every fire due in the window
    (before, during and after the outage: misfire policy fire_all) runs."""
    namespace = "outage"
    client = client_for(aof_server.url)
    store = TaskStore(client, namespace, default_partitions=4)
    ids, start_ms = await periodic_tasks(store)
    await client.aclose()

    async def restart_redis(node: NodeProcess) -> list[dict[str, Any]]:
        aof_server.kill()
        await trio.sleep(3.0)
        await trio.to_thread.run_sync(aof_server.start, aof_server.port)
        return await trio.to_thread.run_sync(node.wait_for, "redis_reachable")

    config = node_config(tmp_path, aof_server.url, namespace)
    node, back = await fault_under_a_running_node(config, record, ids, start_ms, restart_redis)
    assert "node_gave_up" not in [e["event"] for e in node.events()]
    # this outage's line (a call timed out on a loaded machine before it may have said an
    # outage of its own, of no length)
    assert any(line["outage_s"] >= 3.0 for line in back), back


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_node_rides_out_a_stalled_redis(
    aof_server: RedisProcess, tmp_path: Path, record: Path
) -> None:
    """``CLIENT PAUSE 3000 ALL`` (three times the node's socket timeout): calls time out,
    the node waits instead of crashing, and every fire due in the window runs."""
    namespace = "stall"
    client = client_for(aof_server.url)
    store = TaskStore(client, namespace, default_partitions=4)
    ids, start_ms = await periodic_tasks(store)

    async def stall(node: NodeProcess) -> None:
        await client.execute("CLIENT", "PAUSE", 3000, "ALL")
        await trio.to_thread.run_sync(node.wait_for, "redis_reachable")

    config = node_config(tmp_path, aof_server.url, namespace)
    try:
        node, _ = await fault_under_a_running_node(config, record, ids, start_ms, stall)
    finally:
        await client.aclose()
    assert "redis_unreachable" in [e["event"] for e in node.events()]


async def test_a_step_that_fails_while_redis_answers_is_repeated_with_backoff(
    autojump_clock: Any,
) -> None:
    """A server that answers PING but not the step (a Cluster's slot without a master,
    CLUSTERDOWN, TRYAGAIN): the step is repeated as often as a probe would be, not in a
    loop. On trio's autojump clock: the 10 s are virtual."""
    client = RedisClient.from_settings(
        "redis://127.0.0.1:1/0", RedisSection(url="redis://127.0.0.1:1/0")
    )
    calls = 0

    async def answering_ping() -> bool:
        await trio.lowlevel.checkpoint()
        return True

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls > 1000:
            raise RuntimeError("repeated in a loop")
        raise RedisUnavailable("CLUSTERDOWN The cluster is down")

    client.ping = answering_ping  # type: ignore[method-assign]
    with trio.move_on_after(10):
        await client.ride_out(step)
    # 50 ms doubling to 1 s, jittered down to half: at most ~27 in 10 s.
    assert 5 <= calls <= 30


async def test_a_probe_answered_with_a_refusal_ends_the_wait(autojump_clock: Any) -> None:
    """A refusal is an answer: the wait for Redis ends, and the step meets the refusal
    itself (waited out as a refusal, with its line), rather than probing for ever."""
    client = RedisClient.from_settings(
        "redis://127.0.0.1:1/0", RedisSection(url="redis://127.0.0.1:1/0")
    )

    async def refused_ping() -> bool:
        await trio.lowlevel.checkpoint()
        raise RedisRefused("permission", "NOPERM this user has no permissions", "the ACL")

    client.ping = refused_ping  # type: ignore[method-assign]
    with trio.fail_after(1):
        await client.wait_until_reachable()
