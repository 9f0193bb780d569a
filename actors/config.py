"""``node.toml`` for a Metronome node: which actors run here, and with what settings.

The runtime owns ``[node]``, ``[log]`` and ``[redis]``; this module adds ``namespace`` and
``[scheduler]``. Every class is frozen; unknown keys and wrong types are errors that name the
key path (see ``runtime.config``).
"""

from __future__ import annotations

import attrs

from runtime.config import LogSection, NodeSection, RedisSection, positive, safe_name, within


@attrs.frozen
class SchedulerSection:
    """``[scheduler]``: the pollers that move due tasks into their type's stream."""

    pollers: int = attrs.field(default=1, validator=within(0))
    """Poller actors on this node; poller i serves partitions p with p % pollers == i.
    Pollers on different nodes may overlap: claims keep them from enqueuing twice."""
    partitions: int = attrs.field(default=16, validator=within(1, 1024))
    """Partitions of a new namespace. Fixed once the namespace exists (stored in its meta
    key); a node whose value differs uses the stored one and says so in its log."""
    batch_size: int = attrs.field(default=1000, validator=within(1))
    """Most due tasks claimed from one partition in one round trip."""
    max_tick_s: float = attrs.field(default=0.25, validator=positive)
    """Longest sleep between polls: bounds how late a task created for "now" is noticed."""
    claim_lease_ms: int = attrs.field(default=10_000, validator=within(100))
    """How long a claimed batch is reserved for its poller; a poller that dies holding a
    claim delays those fires by at most this long."""


@attrs.frozen
class Config:
    """The whole node.toml."""

    node: NodeSection = attrs.field(factory=NodeSection)
    log: LogSection = attrs.field(factory=LogSection)
    redis: RedisSection = attrs.field(factory=RedisSection)
    namespace: str = attrs.field(default="metronome", validator=safe_name("namespace"))
    scheduler: SchedulerSection = attrs.field(factory=SchedulerSection)
