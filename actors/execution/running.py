"""Running one message's handler, turning whatever happens into an ``Outcome`` (success,
``RetryLater``, ``Unrecoverable``, any other exception, timeout). A handler that calls
``sys.exit()`` fails its run like any exception: it must not end the node's process,
whose restart would run the same message again (and again), never counting it poison."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from actors.execution.completion import Outcome, describe_error
from actors.execution.handlers import (
    Handler,
    HandlerContext,
    RetryLater,
    Unrecoverable,
    retry_delay_s,
)
from actors.store.messages import Message
from runtime.logging import get_logger


def now_ms() -> int:
    return int(time.time() * 1000)


#: Most threads of hung plain handlers a type lends extra tokens for; past it, new runs wait
#: for a thread (and may time out unstarted): the handler is broken, and the log says so.
MAX_HUNG_THREADS = 1000


#: What a handler's run lets through: its cancellation (a timeout, the node stopping). Any
#: other error ends the run as failed, never the node: a node that died of a message would
#: take it back at its restart and die again. ``KeyboardInterrupt`` too: the node receives
#: SIGINT itself (``runtime.node``), so trio never raises it in a task, and one out of a
#: handler is the handler's own (as is a ``GeneratorExit``: trio closes no running task).
_GOES_ON = trio.Cancelled


class HandlerInterrupt(Exception):
    """A plain handler raised ``KeyboardInterrupt`` or ``GeneratorExit`` in its thread:
    its run failed, like any error of the handler's."""


@attrs.frozen
class _Awaited:
    """What a plain handler returned that must be awaited (a coroutine): carried out of
    its thread, which trio would refuse to return it from."""

    awaitable: Any


@attrs.define
class _ThreadCall:
    finished: bool = False
    abandoned: bool = False


def _refused_delay(
    message: Message, started_ms: int, exc: BaseException, bad: Exception
) -> Outcome:
    """A run whose ``RetryLater`` asked for a delay ``retry_delay_s`` refused (``bad``):
    failed, its error the refusal caused by the ``RetryLater`` (both tracebacks)."""
    bad.__cause__ = exc
    return Outcome(message, started_ms, now_ms(), error=describe_error(bad))


def _group_outcome(message: Message, started_ms: int, group: BaseExceptionGroup[Any]) -> Outcome:
    """A run that raised a group (a handler's nursery: trio wraps its errors) as its
    errors ask: any ``Unrecoverable`` dead-letters it, ``RetryLater`` alone retries it
    after the longest delay asked, anything else fails it. The error told is one of the
    group's (the one that decided), not the group's frame, whose last line is a border."""
    leaves = list(_leaves(group))
    dead = next((e for e in leaves if isinstance(e, Unrecoverable)), None)
    if dead is not None:
        return Outcome(
            message, started_ms, now_ms(), error=describe_error(dead), unrecoverable=True
        )
    other = next((e for e in leaves if not isinstance(e, RetryLater)), None)
    if other is not None:
        return Outcome(message, started_ms, now_ms(), error=describe_error(other))
    delays: list[tuple[float, BaseException]] = []
    for exc in leaves:
        try:  # checked again, as for one RetryLater (Runner.run)
            delays.append((retry_delay_s(getattr(exc, "delay_s", None)), exc))
        except Exception as bad:
            return _refused_delay(message, started_ms, exc, bad)
    delay_s, slowest = max(delays, key=lambda pair: pair[0])
    return Outcome(
        message, started_ms, now_ms(), error=describe_error(slowest), retry_after_s=delay_s
    )


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


class Runner:
    """Runs handlers of one type: async ones on the trio thread, plain ones on threads
    (at most ``concurrency`` running at once).

    A plain handler past its timeout cannot be stopped: its thread is abandoned and runs on,
    holding its limiter token until it returns. So that ``concurrency`` hung handlers do not
    starve the type (every later run timing out before it starts), each abandoned thread
    lends the limiter one more token, taken back when the thread finally returns."""

    def __init__(self, handler: Handler, timeout_s: float, concurrency: int) -> None:
        self.handler = handler
        self.timeout_s = timeout_s
        self._thread_limiter = trio.CapacityLimiter(concurrency)
        self.hung = 0
        """Threads abandoned on timeout that have not returned yet."""
        self._log = get_logger()

    async def run(self, message: Message, actor: str, started_ms: int) -> Outcome:
        """The handler's run, as an ``Outcome``. No timeout here: the caller runs this inside
        a cancel scope the type's timeout cancels (``actors.execution.pool``), and turns a
        cancelled run into ``timed_out``."""
        try:
            result = await self._call(message, actor)
        except RetryLater as exc:
            try:  # checked again: a subclass or a handler may have set it since
                delay_s = retry_delay_s(getattr(exc, "delay_s", None))
            except Exception as bad:  # a failed attempt, with the reason (a delay's own)
                return _refused_delay(message, started_ms, exc, bad)
            return Outcome(
                message, started_ms, now_ms(), error=describe_error(exc), retry_after_s=delay_s
            )
        except Unrecoverable as exc:
            return Outcome(
                message, started_ms, now_ms(), error=describe_error(exc), unrecoverable=True
            )
        except BaseExceptionGroup as group:  # a handler's nursery: errors in a group
            cancelled = group.subgroup(_GOES_ON)
            if cancelled is not None:  # the run cancelled (timed out, the node stopping):
                raise cancelled from None  # that alone goes on
            return _group_outcome(message, started_ms, group)
        except Exception as exc:
            return Outcome(message, started_ms, now_ms(), error=describe_error(exc))
        except BaseException as exc:
            # sys.exit() in a handler (a CLI's main called as a function), KeyboardInterrupt
            # or GeneratorExit it raised, or another error outside Exception
            # (asyncio.CancelledError from an event loop the handler ran): the run fails;
            # only the run's own cancellation goes on
            if isinstance(exc, _GOES_ON):
                raise
            return Outcome(message, started_ms, now_ms(), error=describe_error(exc))
        return Outcome(message, started_ms, now_ms(), result=result)

    def timed_out(self, message: Message, started_ms: int) -> Outcome:
        """The outcome of a run its timeout cancelled."""
        error = f"timeout: handler ran longer than {self.timeout_s:g}s"
        return Outcome(message, started_ms, now_ms(), error=error)

    async def _call(self, message: Message, actor: str) -> Any:
        # By position, in the class's field order: keywords cost a quarter more a fire.
        context = HandlerContext(
            message.task_id, message.schedule_id, message.type, message.payload,
            message.attempt, message.due_ms, actor,
        )  # fmt: skip
        if self.handler.is_async:
            return await self.handler.fn(context)
        call = _ThreadCall()
        token = trio.lowlevel.current_trio_token()

        def in_thread() -> Any:
            try:
                result = self.handler.fn(context)
                # A plain function that returns a coroutine (a sync wrapper of an async
                # handler): awaited on the trio thread once the thread is back.
                return _Awaited(result) if inspect.isawaitable(result) else result
            except (KeyboardInterrupt, GeneratorExit) as exc:
                # No signal reaches a worker thread: the handler raised it itself. The run
                # fails; carried out as is, it would stop the node (and each node that
                # took the message over after it).
                raise HandlerInterrupt(f"{type(exc).__name__} raised by the handler") from exc
            finally:
                token.run_sync_soon(self._thread_returned, call)

        try:
            result = await trio.to_thread.run_sync(
                in_thread, abandon_on_cancel=True, limiter=self._thread_limiter
            )
        except trio.Cancelled:
            if not call.finished and self.hung < MAX_HUNG_THREADS:
                call.abandoned = True
                self.hung += 1
                self._thread_limiter.total_tokens += 1
                self._log.warning(
                    "handler_thread_abandoned", actor=actor, task_id=message.task_id,
                    schedule_id=message.schedule_id, hung_threads=self.hung,
                )  # fmt: skip
            raise
        return await result.awaitable if type(result) is _Awaited else result

    def _thread_returned(self, call: _ThreadCall) -> None:
        """In the trio thread, once a handler's thread returned (abandoned or not)."""
        call.finished = True
        if call.abandoned:
            self.hung -= 1
            self._thread_limiter.total_tokens -= 1
