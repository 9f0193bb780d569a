"""Task handlers: the user code a fire runs, named in node.toml as ``module:function``.

A handler takes one argument, a ``HandlerContext``, and may return any JSON-able result
(written to the results log). ``async def`` handlers (and objects with an async
``__call__``) run on trio; plain functions run in a worker thread (at most the type's
concurrency at once), and a coroutine one returns is awaited on trio. To steer retries a
handler raises ``RetryLater(delay_s)`` (retry after that delay instead of the backoff) or
``Unrecoverable`` (straight to the dead-letter queue, no more attempts), also from a task
of its nursery; any other exception, or the timeout, is a failed attempt. A timeout
cancels an ``async`` handler; a plain function cannot be interrupted, so its attempt is
failed and abandoned: its thread runs on until it returns, and the type is lent a thread
in its place meanwhile (``actors.execution.running.Runner``).

Handlers are resolved when the node starts: a missing module or function, or a function
that cannot take one argument, is a configuration error naming the type.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import attrs
import structlog

from runtime.errors import ConfigError, RuntimeStartError
from runtime.logging import get_logger

#: The longest delay ``RetryLater`` takes: a year.
MAX_RETRY_DELAY_S = 366 * 86_400.0


class RetryLater(Exception):
    """Raised by a handler: retry this fire after ``delay_s`` (counts as an attempt).

    ``delay_s`` is a number of seconds, at most ``MAX_RETRY_DELAY_S`` (below 0: at once).
    Anything else (inf or NaN from a ``Retry-After`` header read carelessly, a string)
    raises ``ValueError`` naming it where the handler raises this, so that run fails as
    any other error would, and is retried by the backoff."""

    def __init__(self, delay_s: float, reason: str = "") -> None:
        self.delay_s = retry_delay_s(delay_s)
        super().__init__(reason or f"retry requested in {self.delay_s:g}s")


def retry_delay_s(delay_s: object) -> float:
    """``delay_s`` as ``RetryLater`` takes it (see there), or ``ValueError``."""
    kind = type(delay_s).__name__
    if isinstance(delay_s, str | bytes | bool) or not hasattr(delay_s, "__float__"):
        raise ValueError(f"RetryLater: delay_s must be a number of seconds, got a {kind}")
    try:  # int, float, Decimal, Fraction, numpy's numbers
        delay = float(delay_s)
    except (TypeError, ValueError, OverflowError):
        delay = math.inf
    if not delay <= MAX_RETRY_DELAY_S:  # NaN fails this too
        raise ValueError(
            f"RetryLater: delay_s must be finite and at most {MAX_RETRY_DELAY_S:g} s, "
            f"got {delay:g} ({kind})"
        )
    return max(0.0, delay)


class Unrecoverable(Exception):
    """Raised by a handler: this fire can never succeed; dead-letter it now."""


@attrs.frozen
class HandlerContext:
    """What a handler gets for one fire."""

    task_id: str
    schedule_id: str
    type: str
    payload: Any
    attempt: int
    """0 for the first run, n for the n-th retry."""
    due_ms: int
    actor: str = "handler"

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """A logger bound to this fire (built on use: most handlers never log)."""
        return get_logger(actor=self.actor, task_id=self.task_id, schedule_id=self.schedule_id)


@attrs.frozen
class Handler:
    name: str
    fn: Callable[[HandlerContext], Any]
    is_async: bool


def resolve(task_type: str, target: str) -> Handler:
    """Import ``module:function`` for ``task_type`` or raise ConfigError naming the type."""
    where = f"consumers.{task_type}.handler"
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ConfigError(f"{where}: {target!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as exc:  # the config's, or the code's: a restart won't do
        raise ConfigError(f"{where}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module's own setup failed (a server away at boot):
        raise RuntimeStartError(  # said in one line, and the node restarted as for any
            f"{where}: importing {module_name!r} failed: {type(exc).__name__}: {exc} "
            "(import it in Python to see the traceback)"
        ) from exc
    fn: Any = module
    for part in attr_path.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"{where}: {module_name!r} has no {attr_path!r}")
    if not callable(fn):
        raise ConfigError(f"{where}: {target!r} is not callable")
    try:
        inspect.signature(fn).bind(None)
    except TypeError as exc:
        raise ConfigError(
            f"{where}: {target!r} must take one argument (the context): {exc}"
        ) from exc
    except ValueError:
        pass  # no signature available (a builtin): trust it
    # An instance whose __call__ is async is run as the async function it is (a sync
    # wrapper that returns a coroutine is awaited after its thread: Runner._call).
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
    return Handler(target, fn, is_async)
