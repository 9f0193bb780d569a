"""The node application: builds a Metronome node's supervision tree from its config.

This is the one place that decides which actors run on a node (asynq's ``NewServer``)::

    node                        rest_for_one: later children need the earlier ones
    ├── redis                   embedded server, only when [redis] url = "embedded"
    ├── scheduler               one_for_one
    │   ├── poller-0 …          [scheduler] pollers; poller i serves partitions p % n == i
    │   └── retry-dispatcher-0 … [execution] retry_dispatchers
    ├── consumers               one_for_one: a failing type never touches another
    │   └── <type>              rest_for_one, one per [consumers.<type>]
    │       ├── consumer        graceful: drains within [node] shutdown_grace_s
    │       └── claimer         hands reclaimed messages to the consumer's mailbox
    └── api                     only with [api]: HTTP on hypercorn; graceful, stops first

``python -m runtime node.toml`` imports this module (``[node] app``) and calls ``build_tree``.
Handlers are imported here, before anything starts: a bad ``module:function`` is a
configuration error naming the type.
"""

from __future__ import annotations

from pathlib import Path

from actors.api.server import ApiServer
from actors.claimer import Claimer, ClaimerSettings
from actors.config import Config, ConsumerSection
from actors.consumer import Consumer, ConsumerState
from actors.handlers import resolve
from actors.messages import Message
from actors.poller import Poller, PollerSettings
from actors.results_log import ResultsLog
from actors.retry_dispatcher import RetryDispatcher
from actors.store import TaskStore
from runtime.channels import Mailbox
from runtime.embedded_redis import EmbeddedRedis, find_server_binary
from runtime.errors import ConfigError
from runtime.redis_io import RedisClient
from runtime.supervisor import ChildSpec, Strategy, SupervisorSpec, supervisor

__all__ = ["Config", "build_tree"]


def build_tree(config: Config) -> ChildSpec:
    children: list[ChildSpec] = []
    if config.redis.url == "embedded" and config.redis.cluster:
        raise ConfigError(
            "redis.cluster: the embedded server is a single standalone Redis; set redis.url "
            "to a node of your cluster, or cluster = false"
        )
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
    if config.consumers:
        results = ResultsLog(Path(config.execution.results_log))
        types = [
            _consumer_group(config, store, results, task_type, section)
            for task_type, section in sorted(config.consumers.items())
        ]
        children.append(supervisor("consumers", types, SupervisorSpec(Strategy.ONE_FOR_ONE)))
    if config.api is not None:
        keys = [key.resolve() for key in config.api.keys]
        api = ApiServer(store, config.api, keys)
        grace = config.node.shutdown_grace_s
        children.append(ChildSpec("api", api.run, graceful=True, shutdown_s=grace))
    return supervisor("node", children, SupervisorSpec(Strategy.REST_FOR_ONE))


def _scheduler(config: Config, store: TaskStore) -> ChildSpec:
    section, execution = config.scheduler, config.execution
    pollers = [
        ChildSpec(
            f"poller-{i}",
            Poller(store, _loop_settings(config, i, section.pollers, section.batch_size)).run,
        )
        for i in range(section.pollers)
    ]
    dispatchers = [
        ChildSpec(
            f"retry-dispatcher-{i}",
            RetryDispatcher(
                store,
                _loop_settings(config, i, execution.retry_dispatchers, execution.retry_batch_size),
            ).run,
        )
        for i in range(execution.retry_dispatchers)
    ]
    return supervisor("scheduler", pollers + dispatchers, SupervisorSpec(Strategy.ONE_FOR_ONE))


def _loop_settings(config: Config, index: int, of: int, batch_size: int) -> PollerSettings:
    """A claim loop's settings (poller or retry dispatcher): timing from [scheduler]."""
    section = config.scheduler
    return PollerSettings(
        index=index,
        of=of,
        batch_size=batch_size,
        max_tick_s=section.max_tick_s,
        min_tick_s=section.min_tick_s,
        claim_lease_ms=section.claim_lease_ms,
        dedupe_window_ms=int(section.dedupe_window_s * 1000),
    )


def _consumer_group(
    config: Config, store: TaskStore, results: ResultsLog, task_type: str, section: ConsumerSection
) -> ChildSpec:
    handler = resolve(task_type, section.handler)
    # Owned here, for the life of the node: restarts of either actor find the same ones.
    inbox: Mailbox[Message] = Mailbox.open(section.concurrency)
    state = ConsumerState()
    consumer = Consumer(store, task_type, section, handler, results, config.node.name, inbox, state)
    children = [
        ChildSpec("consumer", consumer.run, graceful=True, shutdown_s=config.node.shutdown_grace_s)
    ]
    if section.claimer:
        claimer = Claimer(
            store,
            task_type,
            section,
            state,
            inbox,
            config.node.name,
            ClaimerSettings(interval_s=config.execution.claimer_interval_s),
        )
        children.append(ChildSpec("claimer", claimer.run))
    return supervisor(task_type, children, SupervisorSpec(Strategy.REST_FOR_ONE))
