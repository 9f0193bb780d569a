"""Metronome's public API: import from here, never from ``actors`` or ``runtime``.

Everything a handler author, a client user or a script needs is a name of this module;
every other module is internal and may move between releases.

Writing a handler (named in node.toml as ``handler = "myapp.tasks:send_digest"``):

- ``HandlerContext``  what a handler gets for one fire: ``task_id``, ``schedule_id``
  (``task_id:due_ms``, the idempotency key), ``type``, ``payload``, ``attempt``,
  ``due_ms``, ``log`` (a bound structlog logger).
- ``RetryLater``      raise it to retry this fire after ``delay_s`` instead of the backoff.
- ``Unrecoverable``   raise it to dead-letter this fire at once, without more attempts.

Managing tasks through a node's API (requests signed with an API key):

- ``Client``          blocking client: one method per endpoint, each answering the JSON.
- ``AsyncClient``     the same methods as awaitables, for trio and asyncio code.
- ``ApiError``        the API refused a request (``status``, stable ``code``, ``errors``).
- ``ApiUnavailable``  the API could not be reached.

Managing tasks in Redis directly, without a node's API:

- ``TaskStore``       create, update, pause, resume, stop, remove and list tasks.
- ``TaskSpec``        a task as a client defines it (type, schedule, payload, id, labels).
- ``Task``            a task as stored (its spec, status, next due time, counters).
- ``Schedule``        when a task fires: ``interval``, ``cron`` (with ``tz``) or ``once``.
- ``RedisClient``     the connection a ``TaskStore`` uses (``RedisClient.from_settings``).
- ``RedisSection``    connection settings, as the ``[redis]`` section of node.toml.
- ``configure_logging``  set up (or quieten) the JSON log lines store operations write.

Errors a ``TaskStore`` raises (all ``TaskError``):

- ``TaskNotFound``    no task with that id (also a ``KeyError``).
- ``InvalidTask``     a definition or update is invalid; names the field (a ``ValueError``).
- ``TaskConflict``    a create with an existing id and a different definition.
- ``InvalidTransition``  e.g. resuming a stopped task.
- ``LayoutMismatch``  the namespace was written by an incompatible version.

Example, a handler and a script that schedules it::

    from metronome import ApiError, Client, HandlerContext, Unrecoverable

    async def send_digest(ctx: HandlerContext) -> dict:
        if not ctx.payload.get("to"):
            raise Unrecoverable("no recipient")
        return {"sent": 3}

    with Client("http://127.0.0.1:8080", "local", "local-demo-secret-change-me") as api:
        api.create_task("email", {"kind": "cron", "cron": "0 9 * * 1-5"},
                        payload={"to": "team@example.com"}, task_id="weekday-digest")

Names are imported on first use, so a handler module that imports ``metronome`` does not
load the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.admin.async_client import AsyncClient
    from actors.admin.calls import ApiError, ApiUnavailable
    from actors.admin.client import Client
    from actors.domain.errors import (
        InvalidTask,
        InvalidTransition,
        LayoutMismatch,
        TaskConflict,
        TaskError,
        TaskNotFound,
    )
    from actors.domain.model import Task, TaskSpec
    from actors.domain.schedules import Schedule
    from actors.execution.handlers import HandlerContext, RetryLater, Unrecoverable
    from actors.store.tasks import TaskStore
    from runtime.config import RedisSection
    from runtime.logging import configure as configure_logging
    from runtime.redis_io import RedisClient

#: Each public name and where it lives (``module`` or ``module:attribute``).
_WHERE = {
    "HandlerContext": "actors.execution.handlers",
    "RetryLater": "actors.execution.handlers",
    "Unrecoverable": "actors.execution.handlers",
    "Client": "actors.admin.client",
    "AsyncClient": "actors.admin.async_client",
    "ApiError": "actors.admin.calls",
    "ApiUnavailable": "actors.admin.calls",
    "TaskStore": "actors.store.tasks",
    "TaskSpec": "actors.domain.model",
    "Task": "actors.domain.model",
    "Schedule": "actors.domain.schedules",
    "RedisClient": "runtime.redis_io",
    "RedisSection": "runtime.config",
    "configure_logging": "runtime.logging:configure",
    "TaskError": "actors.domain.errors",
    "TaskNotFound": "actors.domain.errors",
    "InvalidTask": "actors.domain.errors",
    "TaskConflict": "actors.domain.errors",
    "InvalidTransition": "actors.domain.errors",
    "LayoutMismatch": "actors.domain.errors",
}

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "AsyncClient",
    "Client",
    "HandlerContext",
    "InvalidTask",
    "InvalidTransition",
    "LayoutMismatch",
    "RedisClient",
    "RedisSection",
    "RetryLater",
    "Schedule",
    "Task",
    "TaskConflict",
    "TaskError",
    "TaskNotFound",
    "TaskSpec",
    "TaskStore",
    "Unrecoverable",
    "configure_logging",
]


def _load(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'metronome' has no attribute {name!r}")
    module, _, attribute = where.partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if not TYPE_CHECKING:
    # Hidden from type checkers: they read the names from the imports above, and a
    # misspelt name stays an error instead of typing as Any.
    __getattr__ = _load
