"""The benchmark's no-op handler: records when it started each fire, in a local file.

One line per call, ``task_id due_ms start_ms``, in ``$METRONOME_BENCH_DIR/fires-<pid>.txt``
(never in the Redis under test). Buffered; flushed when the node process exits.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
import zlib
from typing import IO

import trio

from actors.execution.handlers import HandlerContext

_out: IO[str] | None = None


def _file() -> IO[str]:
    global _out
    if _out is None:
        directory = os.environ.get("METRONOME_BENCH_DIR", ".")
        _out = open(os.path.join(directory, f"fires-{os.getpid()}.txt"), "a", buffering=1 << 16)  # noqa: SIM115
        atexit.register(_out.close)
    return _out


async def record(ctx: HandlerContext) -> None:
    _file().write(f"{ctx.task_id} {ctx.due_ms} {time.time() * 1000:.1f}\n")


_WAIT_S = float(os.environ.get("METRONOME_BENCH_WAIT_MS", "5")) / 1000


async def record_wait(ctx: HandlerContext) -> None:
    """``record``, then waits ``$METRONOME_BENCH_WAIT_MS`` ms, as a handler's I/O call would
    (``bench fire --wait-ms``): every run parks its worker, so the pool's wakes are paid."""
    await record(ctx)
    await trio.sleep(_WAIT_S)


async def record_flushed(ctx: HandlerContext) -> None:
    """``record``, flushed at once: for runs that kill node processes (``--chaos``)."""
    out = _file()
    out.write(f"{ctx.task_id} {ctx.due_ms} {time.time() * 1000:.1f}\n")
    out.flush()


#: ``task_id:from_ms:to_ms``: the fires of that task due in [from_ms, to_ms) kill their
#: process (``record_or_die``: ``bench chaos poison-kill``).
_KILLER_ID, _, _KILLER_WINDOW = os.environ.get("METRONOME_BENCH_KILLER", "::").partition(":")
_KILL_FROM, _, _KILL_TO = _KILLER_WINDOW.partition(":")


async def record_or_die(ctx: HandlerContext) -> None:
    """``record_flushed``; the fire ``$METRONOME_BENCH_KILLER`` names then kills its own
    process (SIGKILL, as native code crashing would), every time it is run."""
    await record_flushed(ctx)
    if ctx.task_id == _KILLER_ID and int(_KILL_FROM) <= ctx.due_ms < int(_KILL_TO):
        os.kill(os.getpid(), signal.SIGKILL)


def is_flaky(task_id: str, due_ms: int) -> bool:
    """One fire in ten, chosen by its schedule_id: fails its first attempt (``--flaky``)."""
    return zlib.crc32(f"{task_id}:{due_ms}".encode()) % 10 == 0


async def record_flaky(ctx: HandlerContext) -> None:
    """``record_flushed`` with the attempt; the ``is_flaky`` fires fail their first."""
    out = _file()
    out.write(f"{ctx.task_id} {ctx.due_ms} {time.time() * 1000:.1f} {ctx.attempt}\n")
    out.flush()
    if ctx.attempt == 0 and is_flaky(ctx.task_id, ctx.due_ms):
        raise RuntimeError("flaky on purpose: the retry must run it")


async def record_long(ctx: HandlerContext) -> None:
    """``record_flushed``, then sleeps ``$METRONOME_BENCH_HOLD_S`` seconds (a long handler
    across a fault: ``bench chaos long-handler``)."""
    out = _file()
    out.write(f"{ctx.task_id} {ctx.due_ms} {time.time() * 1000:.1f}\n")
    out.flush()
    await trio.sleep(float(os.environ.get("METRONOME_BENCH_HOLD_S", "15")))


async def hold(ctx: HandlerContext) -> None:
    """Records its start (flushed at once: the process may be killed), then sleeps
    payload["sleep_s"] seconds."""
    out = _file()
    out.write(f"{ctx.task_id} {ctx.due_ms} {time.time() * 1000:.1f}\n")
    out.flush()
    await trio.sleep(float(ctx.payload.get("sleep_s", 60)))


#: Tasks whose every fire fails (``record_doomed``: ``bench chaos dlq-rejected``).
DOOMED = ("b0", "b1")


async def record_doomed(ctx: HandlerContext) -> None:
    """``record_flushed``; the fires of the ``DOOMED`` tasks then fail (with
    ``max_attempts`` 1, each is a dead letter)."""
    await record_flushed(ctx)
    if ctx.task_id in DOOMED:
        raise RuntimeError("doomed on purpose: its dead letter must be written")
