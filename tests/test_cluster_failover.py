"""A Redis Cluster master failed over under a running node: real processes, a local
cluster of three primaries with a replica each."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import LocalCluster
from tests.execution_harness import (
    fault_node_toml,
    fault_under_a_running_node,
    periodic_tasks,
    records,
)
from tests.node_process import NodeProcess


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    setup = LocalCluster(find_server_binary(), replicas=True).start()
    try:
        yield setup
    finally:
        setup.remove()


def cluster_config(tmp_path: Path, url: str, namespace: str) -> Path:
    return fault_node_toml(tmp_path, url, namespace, cluster=True, partitions=8)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_node_follows_a_cluster_master_failover_and_loses_no_fire(
    cluster: LocalCluster, tmp_path: Path, record: Path
) -> None:
    """Each primary hands over to its replica with no write lost (``LocalCluster.fail_over``):
    the replica becomes the primary of a third of the slots, the node is answered MOVED
    (or loses its connection) and follows; every fire runs."""
    url, namespace = cluster.url, "clusterfailover"
    client = RedisClient.from_settings(url, RedisSection(url=url, cluster=True))
    store = TaskStore(client, namespace, default_partitions=8)
    ids, start_ms = await periodic_tasks(store)
    await client.aclose()

    async def fail_over(_node: NodeProcess) -> float:
        for index in range(len(cluster.nodes)):  # every shard changes hands
            await trio.to_thread.run_sync(cluster.fail_over, index)
        return time.time() * 1000

    _, promoted_ms = await fault_under_a_running_node(
        cluster_config(tmp_path, url, namespace), record, ids, start_ms, fail_over
    )
    assert any(r["t_ms"] > promoted_ms for r in records(record))
