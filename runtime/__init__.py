"""The generic actor runtime: actors, supervisors, channels, node config, logging, Redis I/O.

Nothing in this package knows about tasks or schedules; the scheduler's roles live in
``actors/`` and are plugged in through a node application (see ``runtime.app``).
"""

from runtime.actor import ActorContext, ActorFn, TaskStatus, actor
from runtime.channels import Mailbox
from runtime.errors import (
    ConfigError,
    RedisRefused,
    RedisUnavailable,
    RestartIntensityExceeded,
    RuntimeStartError,
)
from runtime.supervisor import ChildSpec, Restart, Strategy, SupervisorSpec, supervisor

__all__ = [
    "ActorContext",
    "ActorFn",
    "ChildSpec",
    "ConfigError",
    "Mailbox",
    "RedisRefused",
    "RedisUnavailable",
    "Restart",
    "RestartIntensityExceeded",
    "RuntimeStartError",
    "Strategy",
    "SupervisorSpec",
    "TaskStatus",
    "actor",
    "supervisor",
]
