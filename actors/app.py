"""The node application: builds a Metronome node's supervision tree from its config.

This is the one place that decides which actors run on a node (asynq's ``NewServer``)::

    node                      rest_for_one: later children need the earlier ones
    ├── redis                 embedded server, only when [redis] url = "embedded"
    └── scheduler             one_for_one
        ├── poller-0          partitions p with p % pollers == 0
        └── poller-1 ...

``python -m runtime node.toml`` imports this module (``[node] app``) and calls ``build_tree``.
"""

from __future__ import annotations

from pathlib import Path

from actors.config import Config
from actors.poller import Poller, PollerSettings
from actors.store import TaskStore
from runtime.embedded_redis import EmbeddedRedis, find_server_binary
from runtime.redis_io import RedisClient
from runtime.supervisor import ChildSpec, Strategy, SupervisorSpec, supervisor

__all__ = ["Config", "build_tree"]


def build_tree(config: Config) -> ChildSpec:
    children: list[ChildSpec] = []
    if config.redis.url == "embedded":
        # No binary: one clear error line now, not a crash loop later.
        binary = find_server_binary(config.redis.server_binary)
        embedded = EmbeddedRedis(Path(config.redis.data_dir), config.redis.embedded_port, binary)
        children.append(ChildSpec("redis", embedded.run, shutdown_s=10))
        url = embedded.url
    else:
        url = config.redis.url
    client = RedisClient.from_settings(url, config.redis)
    store = TaskStore(client, config.namespace, default_partitions=config.scheduler.partitions)
    children.append(_scheduler(config, store))
    return supervisor("node", children, SupervisorSpec(Strategy.REST_FOR_ONE))


def _scheduler(config: Config, store: TaskStore) -> ChildSpec:
    section = config.scheduler
    pollers = [
        ChildSpec(
            f"poller-{i}",
            Poller(
                store,
                PollerSettings(
                    index=i,
                    of=section.pollers,
                    batch_size=section.batch_size,
                    max_tick_s=section.max_tick_s,
                    claim_lease_ms=section.claim_lease_ms,
                ),
            ).run,
        )
        for i in range(section.pollers)
    ]
    return supervisor("scheduler", pollers, SupervisorSpec(Strategy.ONE_FOR_ONE))
