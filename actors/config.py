"""``node.toml`` for a Metronome node: which actors run here, and with what settings.

The runtime owns ``[node]``, ``[log]`` and ``[redis]``; this module adds ``namespace`` and
``[scheduler]``. Every class is frozen; unknown keys and wrong types are errors that name the
key path (see ``runtime.config``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import attrs

from actors.domain.api_keys import KEY_ID_PATTERN, ApiKey
from actors.store.definitions import DEFAULT_CACHED_DEFINITIONS
from actors.store.flights import DEFAULT_CLAIM_LEASE_MS
from actors.store.history import DEFAULT_HISTORY, MAX_HISTORY
from actors.store.keys import DEFAULT_BUCKETS, MAX_BUCKETS
from runtime.config import (
    LogSection,
    NodeSection,
    RedisSection,
    check_name,
    positive,
    safe_name,
    within,
)
from runtime.errors import ConfigError

#: Shortest API secret accepted.
MIN_SECRET_CHARS = 16

#: Partitions of a new namespace when ``[scheduler] partitions`` is not set: on a standalone
#: Redis, and on a Redis Cluster. A partition's keys live in one hash slot and the busiest
#: master fills first: with 16 the busiest of 3 masters holds ~1.3x its share (up to 1.5x,
#: by the namespace's name), with 64 ~1.1x (docs/PERFORMANCE.md, "Scale-out").
STANDALONE_PARTITIONS = 16
CLUSTER_PARTITIONS = 64


def new_namespace_partitions(partitions: int | None, cluster: bool) -> int:
    """The partitions a namespace gets when it is created: ``partitions`` where set, else
    the default for a Redis Cluster or a standalone one."""
    if partitions is not None:
        return partitions
    return CLUSTER_PARTITIONS if cluster else STANDALONE_PARTITIONS


def _type_list(_inst: object, attr: attrs.Attribute[Any], value: list[str]) -> None:
    for name in value:
        try:
            check_name("type", name)
        except ValueError as exc:
            raise ValueError(f"{attr.name}: {exc}") from None


def _type_names(_inst: object, attr: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    for name in value:
        try:
            check_name("type", name)
        except ValueError as exc:
            raise ValueError(f"{attr.name}.{name}: {exc}") from None


@attrs.frozen
class SchedulerSection:
    """``[scheduler]``: the pollers that move due tasks into their type's stream."""

    pollers: int = attrs.field(default=1, validator=within(0))
    """Poller actors on this node. Every live poller of the namespace (on any node) owns an
    equal share of the partitions, one poller per partition at a time; a poller's share is
    taken over within ``claim_lease_ms`` when it dies, at once when it stops. One poller
    serves ~20,000 fires/s; more spread the work over nodes (docs/PERFORMANCE.md)."""
    partitions: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(within(1, 1024))
    )
    """Partitions of a new namespace; not set: ``STANDALONE_PARTITIONS`` (16), or
    ``CLUSTER_PARTITIONS`` (64) with ``[redis] cluster``. Fixed once the namespace exists
    (stored in its meta key); a node set to another number uses the stored one, and its
    pollers say so (``partitions_differ``)."""
    buckets: int = attrs.field(default=DEFAULT_BUCKETS, validator=within(1, MAX_BUCKETS))
    """Buckets per partition of a new namespace (fixed once it exists, like partitions).
    Tasks are stored ~``tasks / (partitions * buckets)`` to a bucket hash; up to 128 a
    bucket stays in Redis's compact encoding, which is what makes a task cost ~250 bytes.
    The default suits up to ~1.5 million tasks with 16 partitions (~6 million with 64); for
    more, raise it to about ``tasks / (partitions * 64)`` before the namespace is first
    used."""
    batch_size: int = attrs.field(default=1000, validator=within(1))
    """Most due tasks claimed from one partition in one round trip."""
    max_tick_s: float = attrs.field(default=0.25, validator=positive)
    """Longest sleep between polls: bounds how late a task created for "now" is noticed."""
    min_tick_s: float = attrs.field(default=0.02, validator=within(0, 1))
    """Shortest sleep between polls that found nothing more due, as far as
    ``max_batch_delay_ms`` allows (the shorter of the two holds): fires due within it are
    handled together (fewer, larger batches for the poller, the stream and the
    consumers). Below ~10,000 fires a second a tick costs about the same whatever it
    carries, so the pause sets the node's CPU (docs/PERFORMANCE.md). Above 200 / pause
    fires a second in the namespace (each poller's own rate scaled by its share of the
    partitions) the pause shrinks so a tick gathers at most 200 fires (10 ms at
    20,000/s): ``paced_pause_s`` in ``actors/scheduling/claim_loop.py``. 0 = the lowest
    lag at the most CPU."""
    max_batch_delay_ms: int = attrs.field(default=10, validator=within(0, 1000))
    """The lag budget: the most the pause between a poller's ticks may add to a fire's
    lateness. It caps ``min_tick_s`` (whose longer pauses gather more fires a tick for
    less CPU): 10 keeps the enqueue lag a poller adds to ~10 ms at any rate, at some CPU
    below ~10,000 fires/s (docs/PERFORMANCE.md); raise it to trade lateness for CPU."""
    claim_lease_ms: int = attrs.field(
        default=DEFAULT_CLAIM_LEASE_MS, validator=within(100, 3_600_000)
    )
    """How long a poller's hold on a partition lasts without renewal (every tick renews
    it): a poller that dies delays its partitions' fires by at most about this long (they
    are fired late, not missed). Also how long a fire a poller put in flight, unconfirmed,
    is left to it before another claim or an operator's call appends it again (this
    node's API uses its own value: set it alike on every node)."""
    dedupe_window_s: float = attrs.field(default=60.0, validator=within(0))
    """A fire (schedule_id and attempt) enqueued again within this window is dropped: the
    second enqueue after a poller or dispatcher died between enqueue and commit. Keep it
    above claim_lease_ms; it keeps each tick's marker (~25 bytes a fire) this long (0 = off)."""

    definition_cache: int = attrs.field(default=DEFAULT_CACHED_DEFINITIONS, validator=within(0))
    """Most task definitions (type, payload, schedule) each poller keeps between claims, by
    task version: a claim then reads a task's state alone, one Redis hash read a fire
    fewer; and as many of the states it committed (``actors.store.known_states``): a claim
    then reads no record while no API write touched the partition. Only tasks that fire
    again within 5 minutes; ~560 + ~300 bytes of scheduler memory a task kept; past it the
    rest are read with each claim as before (0 = keep none)."""

    history: int = attrs.field(default=DEFAULT_HISTORY, validator=within(0, MAX_HISTORY))
    """Occurrences kept per task (``GET /v1/tasks/{id}/history``): the fate of each of its
    last grid times and manual fires, written by the scripts that decide it, 12 bytes an
    entry (a full ring of 20 is 246 bytes of Redis a task). Every node of a namespace
    should agree; 0 keeps none (the attention list still works)."""

    def __attrs_post_init__(self) -> None:
        if 0 < self.dedupe_window_s * 1000 <= self.claim_lease_ms:
            raise ValueError(
                f"scheduler.dedupe_window_s: must be longer than claim_lease_ms "
                f"({self.claim_lease_ms} ms), got {self.dedupe_window_s:g} s: a fire "
                "enqueued again after its claim expired would not be recognised"
            )


@attrs.frozen
class ConsumerSection:
    """``[consumers.<type>]``: run this type's handler on this node, and how."""

    handler: str
    """``module:function`` that runs one fire; ``async def`` runs on trio, a plain function
    in a worker thread. Chosen here only: nothing an API client sends can name code."""
    concurrency: int = attrs.field(default=10, validator=within(1, 10_000))
    """Handlers of this type running at once on this node; also the most messages it reads."""
    timeout_s: float = attrs.field(default=60.0, validator=positive)
    """A handler running longer is cancelled and the attempt counts as failed."""
    max_attempts: int = attrs.field(default=3, validator=within(1, 1000))
    """Attempts (the first run included) before a fire goes to the dead-letter queue."""
    backoff_base_s: float = attrs.field(default=10.0, validator=positive)
    """Retry n waits ``backoff_base_s * 2**(n-1)``, capped, with jitter."""
    backoff_cap_s: float = attrs.field(default=300.0, validator=positive)
    backoff_jitter: float = attrs.field(default=0.1, validator=within(0, 1))
    """Each delay is stretched by a random fraction up to this (0.1 = up to +10%)."""
    lease_s: float = attrs.field(default=30.0, validator=within(1))
    """A message pending this long without renewal is reclaimed by another consumer; live
    handlers renew theirs every lease_s / 3."""
    max_deliveries: int = attrs.field(default=5, validator=within(1, 1000))
    """A message delivered this many times (it keeps killing its consumer) is poison: it
    goes to the dead-letter queue instead of being reclaimed again."""
    dedupe_window_s: float = attrs.field(default=0.0, validator=within(0))
    """Also check at start that no other message of this fire (schedule_id and attempt)
    started within this window; for streams that other producers write to as well.
    Pollers already drop duplicates at enqueue ([scheduler] dedupe_window_s), so this is
    off by default: it costs a round trip per read (0 = off)."""
    block_ms: int = attrs.field(default=500, validator=within(10, 2000))
    """Longest XREADGROUP wait; bounds how fast a stop request is noticed."""
    claimer: bool = True
    """Run this type's claimer on this node."""
    late_after_s: float = attrs.field(default=60.0, validator=within(0))
    """A fire of this type that starts later than this after it was due puts its task on
    the attention list (``GET /v1/attention``, reason ``late``) until a fire starts on
    time (0 = never)."""


@attrs.frozen
class ExecutionSection:
    """``[execution]``: what every consumer on this node shares."""

    results_log: str = "metronome-data/results.jsonl"
    """Handlers' results, one JSON line per finished fire (the seed's business log)."""
    results_log_max_bytes: int = attrs.field(default=256 * 1024 * 1024, validator=within(0))
    """Rotate the results log when it reaches this size (0 = never: leave it to logrotate,
    which needs no ``copytruncate``: every write opens the file by name)."""
    results_log_backups: int = attrs.field(default=5, validator=within(1, 1000))
    """Rotated files kept: ``results.jsonl.1`` (newest) .. ``.N``; older ones are deleted."""
    retry_dispatchers: int = attrs.field(default=1, validator=within(0, 64))
    """Retry dispatcher actors on this node (partitions split like pollers')."""
    retry_batch_size: int = attrs.field(default=500, validator=within(1))
    claimer_interval_s: float = attrs.field(default=1.0, validator=positive)
    """How often each claimer looks for stuck messages."""


@attrs.frozen
class ProcessesSection:
    """``[processes]``: run parts of this node in child processes, one core each.

    One Python process uses one core at a time (the GIL): a node that polls, consumes and
    serves the API in one process tops out near one core. Each part named here runs in
    child processes of its own instead, started, supervised (restarted when they die) and
    stopped by the node's main process (``runtime.process``). 0 keeps a part in the main
    process. Run at most about as many busy processes as the host has cores.
    """

    scheduler: int = attrs.field(default=0, validator=within(0, 1))
    """1: the pollers and retry dispatchers run in a child process ``scheduler``."""
    consumers: int = attrs.field(default=0, validator=within(0, 64))
    """N > 0: N child processes ``consumers-1`` … ``consumers-N`` each run every
    ``[consumers.<type>]`` of this node (N consumers per type in the group)."""
    api: int = attrs.field(default=0, validator=within(0, 64))
    """N > 0: N child processes ``api-1`` … ``api-N`` serve the HTTP API on ``[api] bind``
    (with N > 1 they share the port through ``SO_REUSEPORT``, so it must not be 0). Their
    ``/readyz`` covers their own process and what the main process reports down."""

    def parts(self) -> list[str]:
        """The child processes' part names, in start order."""
        return (
            ["scheduler"] * self.scheduler
            + [f"consumers-{i}" for i in range(1, self.consumers + 1)]
            + [f"api-{i}" for i in range(1, self.api + 1)]
        )


def _key_id(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    if not KEY_ID_PATTERN.fullmatch(value):
        raise ValueError(f"{attr.name}: {value!r} must be 1-64 of letters, digits, '_', '.', '-'")


def _unique_keys(_inst: object, attr: attrs.Attribute[Any], value: list[ApiKeySection]) -> None:
    ids = [k.id for k in value]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{attr.name}: key ids must be unique; repeated: {', '.join(duplicates)}")


def split_bind(value: str) -> tuple[str, str, bool]:
    """``host:port`` into the host (brackets of an IPv6 address taken off), the port as
    written, and whether the host was bracketed. No checks: ``_bind`` validates."""
    host, _, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    return (host[1:-1] if bracketed else host), port, bracketed


def _bind(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    host, port, bracketed = split_bind(value)
    if ":" not in value or not host or not port.isdecimal() or int(port) > 65535:
        raise ValueError(f"{attr.name}: {value!r} must be host:port, e.g. 127.0.0.1:8080")
    # An address written as numbers must be one (256.1.1.1 passed, and failed only when
    # the listener started: a crash loop, then the node gave up); a name is looked up then.
    if bracketed or ":" in host:
        ok = bracketed and _is_ipv6(host)
    elif host.replace(".", "").isdecimal():
        ok = _is_ipv4(host)
    else:
        ok = True
    if not ok:
        raise ValueError(
            f"{attr.name}: {host!r} in {value!r} is not an IP address (an IPv6 one in "
            "brackets: [::1]:8080)"
        )


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def _is_ipv4(text: str) -> bool:
    """In any form the system's resolver takes (``127.1`` and ``0`` too: they bind)."""
    try:
        socket.inet_aton(text)
    except OSError:
        return False
    return True


#: What the examples' secrets say (deploy/node.toml, deploy/k8s): refused on an API that
#: listens beyond this host.
PLACEHOLDER = "change-me"


@attrs.frozen
class ApiKeySection:
    """``[[api.keys]]``: one key that may sign requests."""

    id: str = attrs.field(validator=_key_id)
    secret: str | None = attrs.field(default=None, repr=False)
    """The shared secret itself (at least 16 characters). Prefer ``secret_env``."""
    secret_env: str | None = None
    """Name of an environment variable holding the secret: keeps it out of the file."""
    read_only: bool = False
    """May only GET: for dashboards and monitoring."""

    def __attrs_post_init__(self) -> None:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError(f"key {self.id!r}: set exactly one of secret or secret_env")

    def resolve(self, exposed: bool = False) -> ApiKey:
        """The key with its secret; ConfigError when the secret is missing or too short,
        or, with ``exposed`` (the API listens beyond this host), a placeholder of the
        examples (``change-me``): anyone who read them could sign requests."""
        secret = self.secret
        if self.secret_env is not None:
            secret = os.environ.get(self.secret_env)
            if not secret:
                raise ConfigError(
                    f"api.keys {self.id!r}: environment variable {self.secret_env} is not set"
                )
        assert secret is not None
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"api.keys {self.id!r}: the secret must be at least {MIN_SECRET_CHARS} characters"
            )
        if exposed and PLACEHOLDER in secret.lower():
            raise ConfigError(
                f"api.keys {self.id!r}: the secret is an example's placeholder ('{PLACEHOLDER}' "
                "in it) and the API listens beyond this host; set a random one (openssl rand "
                "-hex 24)"
            )
        return ApiKey(self.id, secret.encode(), self.read_only)


@attrs.frozen
class ApiSection:
    """``[api]``: serve the HTTP API from this node."""

    keys: list[ApiKeySection] = attrs.field(validator=_unique_keys)
    """Who may call it; every request is signed with one of these (``actors.api.signing``)."""
    bind: str = attrs.field(default="127.0.0.1:8080", validator=_bind)
    """``host:port`` to listen on (port 0 picks a free one and logs it)."""
    skew_s: float = attrs.field(default=300.0, validator=within(1, 3600))
    """A request signed further than this from Redis's clock is refused."""
    max_body_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=within(1024))
    """Larger request bodies are refused with 413 before they are read."""
    max_bulk: int = attrs.field(default=10_000, validator=within(1, 100_000))
    """Most tasks in one bulk create."""
    min_interval_s: float = attrs.field(default=1.0, validator=within(0.001, 86_400))
    """Shortest ``every_s`` a client may create or update a task with: sub-second intervals
    multiply fires (and the AOF) fast, so they are an explicit choice of the operator.
    Tasks created from Python (``TaskStore``) are not bound by it."""
    task_types: list[str] = attrs.field(factory=list, validator=_type_list)
    """The namespace's task types: when set, creating a task of any other type is refused
    (catches typos that would otherwise queue fires nobody consumes)."""
    backfill_max_fires: int = attrs.field(default=10_000, validator=within(1, 1_000_000))
    """Most fires one backfill request may enqueue (a larger window is refused whole)."""
    backfill_rate: float = attrs.field(default=5_000.0, validator=within(1, 1_000_000))
    """Fires a second a backfill request appends at most, so it does not starve the live
    fires; the request answers when its last fire is in (10,000 fires: 2 s)."""

    @property
    def exposed(self) -> bool:
        """Whether the API listens beyond this host (``bind`` not a loopback address)."""
        host = split_bind(self.bind)[0]
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name: it may resolve anywhere
            return True

    def resolved_keys(self) -> list[ApiKey]:
        """Every key with its secret (``ApiKeySection.resolve``)."""
        return [key.resolve(self.exposed) for key in self.keys]


@attrs.frozen
class ActionsSection:
    """``[actions]``: operators' actions over the tasks a selector matches (``POST
    /v1/tasks/actions``: pause, resume, stop, trigger, delete, backfill many tasks)."""

    batch: int = attrs.field(default=500, validator=within(1, 5000))
    """Tasks per script call: each batch of a partition is applied with its progress mark
    in one atomic step, so this bounds how long one call holds Redis."""
    rate: float = attrs.field(default=5_000.0, validator=within(1, 1_000_000))
    """Tasks a second an action changes at most, so it shares Redis with the live fires."""
    lease_s: float = attrs.field(default=10.0, validator=within(1, 3600))
    """How long a node's hold on an action it applies outlives the node (renewed every
    third of it): a node that dies mid-way has its action taken over after this (at once by
    a node of the same host that sees its process has exited)."""
    resume_interval_s: float = attrs.field(default=2.0, validator=within(0.1, 3600))
    """How often this node's resumer looks for actions left unfinished."""
    resumer: bool = True
    """Run the resumer on this node (it finishes actions whose node died)."""


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(_inst: object, attr: attrs.Attribute[Any], value: list[str]) -> None:
    for net in value:
        try:
            ipaddress.ip_network(net)
        except ValueError as exc:
            raise ValueError(
                f"{attr.name}: {net!r} is not a network in CIDR form, e.g. 10.0.0.0/8 ({exc})"
            ) from None


@attrs.frozen
class MetricsSection:
    """``[metrics]``: Prometheus metrics. The API serves ``/metrics`` whenever it runs;
    ``bind`` adds a listener of its own (for nodes without an API)."""

    bind: str | None = attrs.field(default=None, validator=attrs.validators.optional(_bind))
    """``host:port`` of a ``/metrics``-only listener (port 0 picks one and logs it)."""
    cache_s: float = attrs.field(default=2.0, validator=within(0, 60))
    """Gauges read from Redis are reused for this long: scrapes by several servers (or a
    dashboard) cost Redis one reading per interval."""
    status_count_interval_s: float = attrs.field(default=300.0, validator=within(0, 86_400))
    """How often a process serving /metrics counts tasks by status (``metronome_tasks``):
    it reads every task's state record, seconds at a million tasks, so not per scrape.
    0 = never (the gauge is left out)."""
    token_env: str | None = None
    """Name of an environment variable holding a bearer token: when set, a scrape must send
    ``Authorization: Bearer <token>`` (401 otherwise). The metrics name every task type and
    its rates; the variable keeps the token out of the file."""
    allow: list[str] = attrs.field(factory=list, validator=_networks)
    """Client networks allowed to scrape, in CIDR form (``["10.0.0.0/8"]``); when not
    empty, any other client gets 403. Checked against the TCP peer: behind a proxy, that
    is the proxy."""

    def __attrs_post_init__(self) -> None:
        if self.token_env is not None and not os.environ.get(self.token_env, "").strip():
            raise ValueError(
                f"token_env: environment variable {self.token_env} is not set (or empty, "
                "or white space only)"
            )

    def networks(self) -> list[IPNetwork]:
        """``allow`` parsed (valid: the validator checked each)."""
        return [ipaddress.ip_network(net) for net in self.allow]

    def token(self) -> str | None:
        """The bearer token scrapes must send, or None when ``token_env`` is not set;
        without the white space around it (a file-based secret's trailing newline): a
        scrape's token is read so too."""
        token = os.environ.get(self.token_env) if self.token_env is not None else None
        return token.strip() if token is not None else None


#: I/O threads (connections) a node needs beyond one per consumer type's blocking read.
IO_THREADS_SPARE = 8


@attrs.frozen
class Config:
    """The whole node.toml."""

    node: NodeSection = attrs.field(factory=NodeSection)
    log: LogSection = attrs.field(factory=LogSection)
    redis: RedisSection = attrs.field(factory=RedisSection)
    namespace: str = attrs.field(default="metronome", validator=safe_name("namespace"))
    scheduler: SchedulerSection = attrs.field(factory=SchedulerSection)
    execution: ExecutionSection = attrs.field(factory=ExecutionSection)
    consumers: dict[str, ConsumerSection] = attrs.field(factory=dict, validator=_type_names)
    api: ApiSection | None = None
    """``[api]``: absent = this node serves no API."""
    processes: ProcessesSection = attrs.field(factory=ProcessesSection)
    metrics: MetricsSection = attrs.field(factory=MetricsSection)
    actions: ActionsSection = attrs.field(factory=ActionsSection)

    def new_namespace_partitions(self) -> int:
        """The partitions a namespace this node creates gets (``[scheduler] partitions``)."""
        return new_namespace_partitions(self.scheduler.partitions, self.redis.cluster)

    def __attrs_post_init__(self) -> None:
        if self.processes.api and self.api is None:
            raise ValueError("processes.api: needs an [api] section to serve")
        if self.processes.api > 1 and self.api is not None and self.api.bind.endswith(":0"):
            raise ValueError("processes.api: several API processes share one port: set api.bind")
        if self.processes.consumers and not self.consumers:
            raise ValueError("processes.consumers: needs at least one [consumers.<type>] section")
        # A blocking read is answered after block_ms, and read with the socket timeout: one
        # not well within it timed out on every idle stream (a false outage, every cycle).
        limit_ms = self.redis.socket_timeout_s * 1000 / 2
        for name, section in self.consumers.items():
            if section.block_ms > limit_ms:
                raise ValueError(
                    f"consumers.{name}.block_ms: {section.block_ms} ms must be at most half "
                    f"of redis.socket_timeout_s ({self.redis.socket_timeout_s:g} s): a read "
                    "that waits that long for messages is read with the socket timeout"
                )
        # Each type's consumer holds an I/O thread (a connection) for up to block_ms while it
        # waits for messages; the pollers', claimers' and API's calls need threads too.
        needed = len(self.consumers) + IO_THREADS_SPARE
        if self.redis.max_connections < needed:
            raise ValueError(
                f"redis.max_connections: {self.redis.max_connections} is too few for "
                f"{len(self.consumers)} consumer types (each holds one while it waits for "
                f"messages): give at least {needed}"
            )
