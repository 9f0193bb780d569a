"""Handlers the tests name in node.toml. Each records what it did in a file named by the
environment (``METRONOME_TEST_RECORD``), one JSON line per call, so a test process can
read what a node process ran."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import trio

from actors.execution.handlers import HandlerContext, RetryLater, Unrecoverable


def _record(ctx: HandlerContext, event: str, path: str | None = None, **extra: Any) -> None:
    path = path or os.environ.get("METRONOME_TEST_RECORD")
    if not path:
        return
    line = {
        "event": event,
        "task_id": ctx.task_id,
        "schedule_id": ctx.schedule_id,
        "attempt": ctx.attempt,
        "due_ms": ctx.due_ms,
        "pid": os.getpid(),
        "t_ms": int(time.time() * 1000),
        **extra,
    }
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


async def noop(ctx: HandlerContext) -> dict[str, Any]:
    _record(ctx, "ran")
    return {"ok": True}


def sync_noop(ctx: HandlerContext) -> str:
    _record(ctx, "ran")
    return "sync-ok"


def sync_sleepy(ctx: HandlerContext) -> str:
    """A plain (threaded) handler that blocks payload["sleep_s"] seconds: past its timeout
    it cannot be cancelled, only abandoned."""
    path = os.environ.get("METRONOME_TEST_RECORD")  # the test that started it, not a later one
    _record(ctx, "started", path)
    time.sleep(float(ctx.payload.get("sleep_s", 1.0)))
    _record(ctx, "ran", path)
    return "slept"


async def sleepy(ctx: HandlerContext) -> str:
    """Sleeps payload["sleep_s"] seconds."""
    _record(ctx, "started")
    await trio.sleep(float(ctx.payload.get("sleep_s", 1.0)))
    _record(ctx, "ran")
    return "slept"


async def failing(ctx: HandlerContext) -> None:
    _record(ctx, "failed")
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


async def flaky(ctx: HandlerContext) -> str:
    """Fails until payload["succeed_on"] attempt."""
    if ctx.attempt < int(ctx.payload.get("succeed_on", 1)):
        _record(ctx, "failed")
        raise RuntimeError("not yet")
    _record(ctx, "ran")
    return "finally"


async def fails_on_due(ctx: HandlerContext) -> str:
    """Fails the fire due at payload["due_ms"], runs every other."""
    if ctx.due_ms == int(ctx.payload["due_ms"]):
        _record(ctx, "failed")
        raise RuntimeError("this one fails")
    _record(ctx, "ran")
    return "ran"


async def slow_flaky(ctx: HandlerContext) -> str:
    """Records its start, sleeps payload["sleep_s"] seconds, then fails until attempt
    payload["succeed_on"] (a test changes Redis while it runs)."""
    _record(ctx, "started")
    await trio.sleep(float(ctx.payload.get("sleep_s", 1.0)))
    if ctx.attempt < int(ctx.payload.get("succeed_on", 1)):
        _record(ctx, "failed")
        raise RuntimeError("not yet")
    _record(ctx, "ran")
    return "finally"


async def asks_retry(ctx: HandlerContext) -> None:
    _record(ctx, "failed")
    raise RetryLater(0.2, "come back soon")


async def hopeless(ctx: HandlerContext) -> None:
    """Fails for good, saying the payload's ``say`` (a handler quoting its input)."""
    _record(ctx, "failed")
    said = ctx.payload.get("say") if isinstance(ctx.payload, dict) else None
    raise Unrecoverable(said or "never going to work")


def not_a_handler() -> None:
    """Takes no context: resolving it must fail."""


async def blocked(ctx: HandlerContext) -> None:
    """Never returns on its own: records its start, and its cancellation."""
    _record(ctx, "started")
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        _record(ctx, "cancelled")
        raise


async def fails_then_blocks(ctx: HandlerContext) -> None:
    """Its first attempt asks for a retry in 2 s; a retry is ``blocked``."""
    if ctx.attempt == 0:
        _record(ctx, "failed")
        raise RetryLater(2.0, "again in 2 s")
    await blocked(ctx)


async def crash(ctx: HandlerContext) -> None:
    """Kills its own process (a crash in native code, the OOM killer), once recorded."""
    _record(ctx, "started")
    os.kill(os.getpid(), signal.SIGKILL)


async def crash_or_sleep(ctx: HandlerContext) -> str:
    """``crash`` where payload["crash"] is set, else sleeps payload["sleep_s"] seconds: a
    message that kills its process among others still running beside it."""
    if ctx.payload.get("crash"):
        await crash(ctx)
    _record(ctx, "started")
    await trio.sleep(float(ctx.payload.get("sleep_s", 1.0)))
    _record(ctx, "ran")
    return "slept"


async def odd_result(ctx: HandlerContext) -> Any:
    """Returns what JSON cannot carry as it is, chosen by payload["kind"]: a dict with
    tuple keys, a lone surrogate, NaN, an object whose ``str`` raises."""
    _record(ctx, "ran")
    kind = ctx.payload["kind"]
    if kind == "tuple_keys":
        return {(1, 2): "pair"}
    if kind == "surrogate":
        return "half \ud800 a pair"
    if kind == "nan":
        return float("nan")
    return _Unprintable()


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for this")

    __repr__ = __str__


async def bad_retry_delay(ctx: HandlerContext) -> None:
    """Asks for a retry after payload["delay"] (inf, a string, ...) on its first attempt."""
    if ctx.attempt == 0:
        _record(ctx, "failed")
        delay = ctx.payload["delay"]
        raise RetryLater(float(delay) if delay in ("inf", "nan", "1e300") else delay)
    _record(ctx, "ran")


async def fails_with_surrogate(ctx: HandlerContext) -> None:
    """Fails with an error text holding a lone surrogate (bytes decoded with
    ``surrogateescape``, say), which UTF-8 cannot encode."""
    _record(ctx, "failed")
    raise RuntimeError("bad byte \udcff in the reply")


class _AsyncCallable:
    """A handler object whose ``__call__`` is async (a class with its own settings)."""

    async def __call__(self, ctx: HandlerContext) -> str:
        await trio.lowlevel.checkpoint()  # needs the trio thread, not a worker thread
        return f"object {ctx.task_id}"


async_callable = _AsyncCallable()


def returns_a_coroutine(ctx: HandlerContext) -> Any:
    """A plain function that returns a coroutine (a decorator's sync wrapper of an async
    handler)."""
    return async_callable(ctx)
