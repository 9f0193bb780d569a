"""A consumer's watch for cancel requests: the running fires of tasks with an overlap policy
that a ``cancel_other`` fire of their task replaced, wherever it was decided (a poller's
claim, an operator's trigger or backfill: ``cancel_fires.lua``), are cancelled here."""

from __future__ import annotations

import functools

import trio

from actors.execution.pool import HandlerPool
from actors.store.scripts import Scripts

#: How often running tracked fires (``TRACKED_LETTERS``) are checked for a cancel request.
CANCEL_CHECK_S = 0.5


async def watch_cancels(scripts: Scripts, pool: HandlerPool, task_type: str) -> None:
    """``cancel_requested`` every ``CANCEL_CHECK_S`` while tracked fires run here, not at
    all otherwise; runs until cancelled."""
    while True:
        await trio.sleep(CANCEL_CHECK_S)
        await cancel_requested(scripts, pool, task_type)


async def cancel_requested(scripts: Scripts, pool: HandlerPool, task_type: str) -> list[str]:
    """Cancel the running fires of ``task_type`` a request names; their schedule ids. A
    request is removed once its run is cancelled (a lost reply before that cancels nothing
    less); one whose run ended meanwhile stays: the fire's ACK removes it, or, failed and
    to be retried, its retry is cancelled as it starts."""
    running = pool.replaceable()
    if not running:
        return []
    named = await scripts.client.ride_out(
        functools.partial(scripts.cancel_requests, task_type, list(running))
    )
    cancelled = pool.cancel([running[sid] for sid in named])
    done = [sid for sid in named if running[sid] in cancelled]
    if done:
        await scripts.client.ride_out(
            functools.partial(scripts.take_cancel_requests, task_type, done)
        )
    return done
