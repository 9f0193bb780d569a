"""The node application: builds a Metronome node's supervision tree from its config.

This is the one place that decides which actors run on a node (asynq's ``NewServer``)::

    node                        one_for_one: each child restarts alone (an embedded
                                server too: the roles ride its outage out)
    ├── redis                   embedded server, only when [redis] url = "embedded"
    ├── scheduler               one_for_one
    │   ├── poller-0 …          [scheduler] pollers; each owns a share of the partitions
    │   └── retry-dispatcher-0 … [execution] retry_dispatchers
    ├── consumers               one_for_one: a failing type never touches another
    │   └── <type>              rest_for_one, one per [consumers.<type>]
    │       ├── consumer        graceful: drains within [node] shutdown_grace_s
    │       └── claimer         hands reclaimed messages to the consumer's mailbox
    ├── api                     only with [api]: HTTP on hypercorn (and /metrics); graceful
    ├── metrics                 only with [metrics] bind: a /metrics-only listener
    ├── action-resumer          finishes operators' actions whose node died ([actions] resumer)
    ├── presence                this process's actors and restarts in ns:nodes, every 5 s;
    │                           ns:meta back if lost
    └── metrics-writer          writes this process's metric counts about every 0.25 s

With ``[processes]``, a part (``scheduler``, ``consumers-1`` … ``consumers-N``, ``api-1`` …)
leaves the main process's tree for a ``ChildProcess`` actor under a last, one-for-one
supervisor ``processes``; the child process runs ``python -m runtime node.toml --part
NAME``, whose tree is ``node`` over that one subtree, so every actor keeps its path. The
embedded server always stays in the main process.

``python -m runtime node.toml`` imports this module (``[node] app``) and calls ``build_tree``.
Handlers are imported here, before anything starts: a bad ``module:function`` is a
configuration error naming the type.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import TypeVar

import attrs

from actors.config import Config, ConsumerSection
from actors.execution.alone import Alone
from actors.execution.claimer import Claimer, ClaimerSettings
from actors.execution.completion import RetryPolicy
from actors.execution.completion_group import CompletionGroup
from actors.execution.consumer import Consumer, ConsumerSettings, ConsumerState
from actors.execution.handlers import resolve
from actors.execution.results_log import ResultsLog
from actors.observability.metrics import install as install_metrics
from actors.observability.metrics_writer import MetricsWriter
from actors.observability.presence import Presence
from actors.scheduling.action_resumer import ActionResumer, ResumerSettings
from actors.scheduling.claim_loop import ClaimLoopSettings
from actors.scheduling.poller import Poller, PollerSettings
from actors.scheduling.retry_dispatcher import RetryDispatcher, RetryDispatcherSettings
from actors.store.apply_actions import ActionSettings
from actors.store.history import DEFAULT_HISTORY
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.app import Invocation
from runtime.channels import Mailbox
from runtime.embedded_redis import EmbeddedRedis, find_server_binary
from runtime.errors import ConfigError
from runtime.process import ChildProcess, part_argv
from runtime.redis_io import RedisClient
from runtime.supervisor import ChildSpec, Strategy, SupervisorSpec, supervisor

__all__ = ["Config", "build_tree"]


def build_tree(config: Config, invocation: Invocation) -> ChildSpec:
    """The node's tree, or with ``invocation.part`` the tree of that one child process."""
    if config.redis.url == "embedded" and config.redis.cluster:
        raise ConfigError(
            "redis.cluster: the embedded server is a single standalone Redis; set redis.url "
            "to a node of your cluster, or cluster = false"
        )
    install_metrics()  # this process counts its events from now on (main or child)
    if invocation.part is not None:
        return _part_tree(config, invocation.part)
    children: list[ChildSpec] = []
    url = config.redis.url
    if url == "embedded":
        embedded = _embedded(config, lock=not invocation.check)
        children.append(ChildSpec("redis", embedded.run, shutdown_s=10))
        # A check builds the clients and never connects them: no password is read (the
        # main process makes it as it starts the server; none may be there yet).
        url = f"unix://{embedded.socket_path}" if invocation.check else embedded.url
    roles = _Roles(config, url)
    grace = config.node.shutdown_grace_s
    parts = config.processes.parts()
    if parts:  # what a child process would fail on is a config error here, at once
        for task_type, section in config.consumers.items():
            resolve(task_type, section.handler)
        if config.api is not None:
            config.api.resolved_keys()
        if config.api is not None and config.processes.api:
            importlib.import_module("actors.api.server")  # what the API processes load
    if "scheduler" not in parts:
        children.append(roles.scheduler())
    if config.consumers and not config.processes.consumers:
        children.append(roles.consumers())
    if config.api is not None and not config.processes.api:
        children.append(roles.api())
    if config.metrics.bind is not None:
        children.append(roles.metrics())
    if parts:
        # One for one: a child process that dies is restarted alone; the others go on.
        processes = [_process(part, invocation, grace) for part in parts]
        children.append(supervisor("processes", processes, _spec(config, Strategy.ONE_FOR_ONE)))
    if config.actions.resumer:
        children.append(roles.action_resumer())
    children.append(roles.presence(config.node.name))  # nothing depends on it
    children.append(_metrics_writer(config))  # last: it stops first (see _metrics_writer)
    # One for one: a child restarts alone. The embedded server, restarted, is waited for
    # by the roles as any Redis outage is (they ride it out); stopping everything after it
    # (each type draining its handlers, its last flush waiting for a server that could not
    # come back until they all had) turned a second's crash into a long outage.
    return supervisor("node", children, _spec(config, Strategy.ONE_FOR_ONE))


def _part_tree(config: Config, part: str) -> ChildSpec:
    """One child process's tree: the same actors, under the same paths, as in a one-process
    node, minus the embedded server, which the main process runs."""
    if part not in config.processes.parts():
        raise ConfigError(f"--part {part!r}: not a part of this node's [processes]")
    embedded = config.redis.url == "embedded"
    # The main process runs the server and holds its data dir's lock: only its URL here.
    url = _embedded(config, lock=False).url if embedded else config.redis.url
    roles = _Roles(config, url, part)
    if part == "scheduler":
        child = roles.scheduler()
    elif part.startswith("api-"):
        child = roles.api()
    else:
        child = roles.consumers()
    presence = roles.presence(f"{config.node.name}/{part}")
    return supervisor(
        "node", [child, presence, _metrics_writer(config)], _spec(config, Strategy.ONE_FOR_ONE)
    )


def _metrics_writer(config: Config) -> ChildSpec:
    """Writes the process's metric counts about every 0.25 s; a tree's last child, so it
    stops first and the roles' last counts are written at once."""
    return ChildSpec("metrics-writer", MetricsWriter(sorted(config.consumers)).run, shutdown_s=3)


def _spec(config: Config, strategy: Strategy) -> SupervisorSpec:
    """Every supervisor of the node: its strategy, the node's bound on restarts in a row."""
    return SupervisorSpec(strategy, max_attempts=config.node.restart_attempts)


def _embedded(config: Config, *, lock: bool = True) -> EmbeddedRedis:
    # No binary: one clear error line now, not a crash loop later.
    binary = find_server_binary(config.redis.server_binary)
    embedded = EmbeddedRedis(Path(config.redis.data_dir), config.redis.embedded_port, binary)
    if lock:  # held for the process's life: a second node refuses at once
        embedded.lock_data_dir()
    return embedded


def _process(part: str, invocation: Invocation, grace_s: float) -> ChildSpec:
    """A child process running ``part``; it drains within its own (shorter) grace."""
    process = ChildProcess(part_argv(invocation.config_path, part, invocation.config_digest))
    return ChildSpec(part, process.run, graceful=True, shutdown_s=grace_s)


LoopSettings = TypeVar("LoopSettings", bound=ClaimLoopSettings)


class _Roles:
    """Builds the subtrees of a node's roles, in whichever process runs them."""

    def __init__(self, config: Config, url: str, part: str | None = None) -> None:
        self.config = config
        self.url = url
        self.part = part
        """The child process's part, or None in the node's main process."""

    @functools.cached_property
    def store(self) -> TaskStore:
        """Built with the first role this process runs: a main process whose roles all run
        in child processes needs no Redis client (a cluster client connects when built)."""
        client = RedisClient.from_settings(self.url, self.config.redis)
        return TaskStore(
            client,
            self.config.namespace,
            default_partitions=self.config.new_namespace_partitions(),
            default_buckets=self.config.scheduler.buckets,
            takeover_ms=self.config.scheduler.claim_lease_ms,
            history=self.config.scheduler.history,
        )

    def scheduler(self) -> ChildSpec:
        return _scheduler(self.config, self.store)

    def consumers(self) -> ChildSpec:
        config = self.config
        execution = config.execution
        results = ResultsLog(
            Path(execution.results_log),
            max_bytes=execution.results_log_max_bytes,
            backups=execution.results_log_backups,
        )
        # One per process: its consumers write their batches together, and run their
        # suspects one at a time (Reader.run_alone).
        group, alone = CompletionGroup(), Alone()
        types = [
            _consumer_group(
                config, self.store, results, group, alone, task_type, section, self.part
            )
            for task_type, section in sorted(config.consumers.items())
        ]
        return supervisor("consumers", types, _spec(config, Strategy.ONE_FOR_ONE))

    def api(self) -> ChildSpec:
        # The HTTP stack loads only on nodes that serve it: a node start is a process start,
        # and hypercorn and starlette are a third of what a node would otherwise import.
        from actors.api.server import ApiServer

        config = self.config
        assert config.api is not None
        keys = config.api.resolved_keys()
        api = ApiServer(
            self.store,
            config.api,
            keys,
            shared_port=config.processes.api > 1,
            metrics=config.metrics,
            actions=action_settings(config),
        )
        grace = config.node.shutdown_grace_s
        return ChildSpec("api", api.run, graceful=True, shutdown_s=grace)

    def action_resumer(self) -> ChildSpec:
        settings = ResumerSettings(self.config.actions.resume_interval_s,
                                   action_settings(self.config))  # fmt: skip
        return ChildSpec("action-resumer", ActionResumer(self.store, settings).run, shutdown_s=3)

    def presence(self, process: str) -> ChildSpec:
        return ChildSpec("presence", Presence(self.store, process).run, shutdown_s=3)

    def metrics(self) -> ChildSpec:
        from actors.observability.endpoint import MetricsServer

        section = self.config.metrics
        server = MetricsServer(self.store, section)
        return ChildSpec("metrics", server.run, graceful=True, shutdown_s=5)


def action_settings(config: Config) -> ActionSettings:
    """How this node applies operators' actions: ``[actions]``, and ``[api]``'s backfill
    bounds where it serves the API."""
    section = config.actions
    settings = ActionSettings(section.batch, section.rate, int(section.lease_s * 1000))
    if config.api is not None:
        settings = attrs.evolve(
            settings, backfill_max_fires=config.api.backfill_max_fires,
            backfill_rate=config.api.backfill_rate,
        )  # fmt: skip
    return settings


def _scheduler(config: Config, store: TaskStore) -> ChildSpec:
    section, execution = config.scheduler, config.execution
    pollers = [
        ChildSpec(
            f"poller-{i}",
            Poller(
                store,
                attrs.evolve(
                    _loop_settings(PollerSettings, config, i, section.pollers, section.batch_size),
                    definition_cache=section.definition_cache,
                    history=section.history,
                    partitions=section.partitions,
                ),
            ).run,
        )
        for i in range(section.pollers)
    ]
    dispatchers = [
        ChildSpec(
            f"retry-dispatcher-{i}",
            RetryDispatcher(
                store,
                _loop_settings(
                    RetryDispatcherSettings,
                    config,
                    i,
                    execution.retry_dispatchers,
                    execution.retry_batch_size,
                ),
            ).run,
        )
        for i in range(execution.retry_dispatchers)
    ]
    return supervisor("scheduler", pollers + dispatchers, _spec(config, Strategy.ONE_FOR_ONE))


def _loop_settings(
    cls: type[LoopSettings], config: Config, index: int, of: int, batch_size: int
) -> LoopSettings:
    """A claim loop's settings (poller or retry dispatcher): timing from [scheduler]."""
    section = config.scheduler
    return cls(
        index=index,
        of=of,
        batch_size=batch_size,
        max_tick_s=section.max_tick_s,
        min_tick_s=section.min_tick_s,
        max_batch_delay_s=section.max_batch_delay_ms / 1000,
        claim_lease_ms=section.claim_lease_ms,
        dedupe_window_ms=int(section.dedupe_window_s * 1000),
    )


def _consumer_group(
    config: Config,
    store: TaskStore,
    results: ResultsLog,
    group: CompletionGroup,
    alone: Alone,
    task_type: str,
    section: ConsumerSection,
    part: str | None,
) -> ChildSpec:
    handler = resolve(task_type, section.handler)
    # Owned here, for the life of the node: restarts of either actor find the same ones.
    inbox: Mailbox[Message] = Mailbox.open(section.concurrency)
    state = ConsumerState()
    # Stable across restarts: the node's name, and its part in a child process (consumer
    # processes of one node must not share a name).
    name = config.node.name if part is None else f"{config.node.name}.{part}"
    settings = consumer_settings(section, config.scheduler.history)
    consumer = Consumer(
        store, task_type, settings, handler, results, config.node.name, inbox, state, name,
        group, alone,
    )  # fmt: skip
    children = [
        ChildSpec("consumer", consumer.run, graceful=True, shutdown_s=config.node.shutdown_grace_s)
    ]
    if section.claimer:
        claimer = Claimer(
            store,
            task_type,
            state,
            inbox,
            config.node.name,
            ClaimerSettings(
                interval_s=config.execution.claimer_interval_s,
                lease_s=section.lease_s,
                max_deliveries=section.max_deliveries,
                history=config.scheduler.history,
            ),
        )
        children.append(ChildSpec("claimer", claimer.run))
    return supervisor(task_type, children, _spec(config, Strategy.REST_FOR_ONE))


def consumer_settings(section: ConsumerSection, history: int = DEFAULT_HISTORY) -> ConsumerSettings:
    """A type's consumer settings from its ``[consumers.<type>]`` section (and the
    namespace's ``[scheduler] history``)."""
    return ConsumerSettings(
        concurrency=section.concurrency,
        timeout_s=section.timeout_s,
        retry=RetryPolicy(
            max_attempts=section.max_attempts,
            backoff_base_s=section.backoff_base_s,
            backoff_cap_s=section.backoff_cap_s,
            backoff_jitter=section.backoff_jitter,
        ),
        lease_s=section.lease_s,
        dedupe_window_s=section.dedupe_window_s,
        block_ms=section.block_ms,
        history=history,
        late_ms=round(section.late_after_s * 1000),
        max_deliveries=section.max_deliveries,
    )
