"""A consumer's leases: renewing those of the messages it is running, so a live, busy
consumer is never robbed, and releasing everything it still holds when it stops, so other
nodes' claimers take it at once."""

from __future__ import annotations

import functools

import structlog
import trio

from actors.execution.completion import fire_fields
from actors.execution.flight import Flight
from actors.store.scripts import Scripts
from runtime.logging import emit_events

#: Idle time given to released messages: past any lease, so any claimer takes them now.
RELEASED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000


async def renew_forever(
    scripts: Scripts, task_type: str, consumer: str, flight: Flight, lease_s: float
) -> None:
    """Every lease/3, reset the idle time of every message in flight (ours only)."""
    while True:
        await trio.sleep(lease_s / 3)
        renew = functools.partial(scripts.renew_leases, task_type, consumer, list(flight.messages))
        await scripts.client.ride_out(renew)


async def release(
    scripts: Scripts,
    task_type: str,
    consumer: str,
    flight: Flight,
    actor: str,
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Hand back everything still pending under our name (unfinished, unstarted, or read by
    an abandoned call), claimable at once elsewhere; leave the group if nothing is pending
    here."""
    released, left = await scripts.release(task_type, consumer, RELEASED_IDLE_MS)
    known = [flight.messages[i] for i in released if i in flight.messages]
    emit_events(actor, [("released", fire_fields(m)) for m in known])
    log.info("consumer_stopped", consumer=consumer, released=len(released), left_group=left)
