"""Structured logs: one JSON object per line on stdout, or console lines for humans.

Every line carries ``time`` (UTC ISO-8601), ``ts_ms`` (epoch milliseconds), ``level``,
``event`` and ``node``; actors bind ``actor`` (their path in the tree). Lifecycle events of
actors and tasks are the audit trail, so they are written synchronously, one ``write`` per
line, and never buffered in memory where a crash would lose them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog


def _epoch_ms(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event["ts_ms"] = int(time.time() * 1000)
    return event


def _dumps(obj: Any, **_kw: Any) -> str:
    return json.dumps(obj, default=str, separators=(",", ":"))


def configure(
    *, node: str, format: str = "json", level: str = "info", stream: TextIO | None = None
) -> None:
    """Set up structlog for this process. Call once, before the first actor starts."""
    renderer: Any
    if format == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    exc_processors: list[Any] = (
        [] if format == "console" else [structlog.processors.format_exc_info]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            _epoch_ms,
            *exc_processors,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(node=node)


def get_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger().bind(**bound)
    return logger
