"""The generic actor runtime: actors, supervisors, channels, node config, logging, Redis I/O.

Nothing in this package knows about tasks or schedules; the scheduler's roles live in
``actors/`` and are plugged in through a node application (see ``runtime.app``).

The names below are loaded on first use: a process that needs only ``runtime.config`` (the
``metronome`` command, a script reading a config) does not pay for trio and the logging stack.
The decorators ``actor`` and ``supervisor`` share their modules' names, so they are imported
from those modules (``from runtime.actor import actor``), never from the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.actor import ActorContext, ActorFn, TaskStatus
    from runtime.channels import Mailbox
    from runtime.errors import (
        ConfigError,
        RedisRefused,
        RedisUnavailable,
        RestartIntensityExceeded,
        RuntimeStartError,
    )
    from runtime.supervisor import ChildSpec, Restart, Strategy, SupervisorSpec

#: Each public name and the module that defines it.
_HOMES = {
    "ActorContext": "runtime.actor",
    "ActorFn": "runtime.actor",
    "TaskStatus": "runtime.actor",
    "Mailbox": "runtime.channels",
    "ConfigError": "runtime.errors",
    "RedisRefused": "runtime.errors",
    "RedisUnavailable": "runtime.errors",
    "RestartIntensityExceeded": "runtime.errors",
    "RuntimeStartError": "runtime.errors",
    "ChildSpec": "runtime.supervisor",
    "Restart": "runtime.supervisor",
    "Strategy": "runtime.supervisor",
    "SupervisorSpec": "runtime.supervisor",
}

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
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
