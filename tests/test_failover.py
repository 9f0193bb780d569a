"""Failover with real processes: a Sentinel-managed primary killed under a running node."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.store.tasks import TaskStore
from runtime.config import RedisSection, parse_sentinel_url
from runtime.embedded_redis import find_server_binary
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import LocalSentinel
from tests.execution_harness import (
    fault_under_a_running_node,
    periodic_tasks,
    records,
)
from tests.node_process import NodeProcess
from tests.test_outages import node_config
from tests.waiting import eventually


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    setup = LocalSentinel(find_server_binary()).start()
    try:
        yield setup
    finally:
        setup.remove()


def test_sentinel_urls_are_parsed_or_refused_by_name() -> None:
    assert parse_sentinel_url("redis+sentinel://u:p%40ss@h1:1,h2/svc/2") == (
        [("h1", 1), ("h2", 26379)], "svc", 2, "u", "p@ss",
    )  # fmt: skip
    for bad in ("redis+sentinel://h1:1", "redis+sentinel://h1:x/svc", "redis+sentinel://h/s/x"):
        with pytest.raises(ValueError, match=r"redis\.url"):
            RedisSection(url=bad)
    with pytest.raises(ValueError, match="must be embedded or a URL starting with"):
        RedisSection(url="http//nope")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_node_follows_a_sentinel_failover_and_loses_no_fire(
    sentinel: LocalSentinel, tmp_path: Path, record: Path
) -> None:
    """SIGKILL the primary: the sentinels promote the replica, the node (which only knows
    the sentinels) waits, finds the new primary, and every fire due meanwhile runs."""
    url, namespace = sentinel.url, "failover"
    client = RedisClient.from_settings(
        url, RedisSection(url=url, connect_timeout_s=0.5, socket_timeout_s=1)
    )
    store = TaskStore(client, namespace, default_partitions=4)
    ids, start_ms = await periodic_tasks(store)
    await client.aclose()

    async def fail_over(_node: NodeProcess) -> float:
        sentinel.primary.kill()

        def promoted() -> bool:
            return sentinel.master_port() == sentinel.replica.port

        await eventually(promoted, 60, poll_s=0.1, what="the replica promoted")
        return time.time() * 1000

    node, promoted_ms = await fault_under_a_running_node(
        node_config(tmp_path, url, namespace), record, ids, start_ms, fail_over
    )
    assert any(r["t_ms"] > promoted_ms for r in records(record))  # on the new primary
    assert "redis_reachable" in [e["event"] for e in node.events()]
