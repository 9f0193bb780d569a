"""A consumer's leases: renewing those of every message it holds (running, finished and
awaiting its flush, or waiting in its mailbox), so a live, busy consumer is never robbed,
and releasing everything it still holds when it stops, so other nodes' claimers take it
at once."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping

import structlog
import trio

from actors.execution.completion import fire_fields
from actors.execution.flight import Flight
from actors.execution.identity import Identity
from actors.store.messages import Message
from actors.store.scripts import Scripts
from runtime.errors import RedisRefused
from runtime.logging import emit_events
from runtime.redis_io import ResponseError

#: Idle time given to messages a stop released: past any lease, so any claimer takes them
#: now, and past a year, so none counts it as a delivery (``reclaim.lua``, ``recover.lua``:
#: a stop is not a death).
RELEASED_IDLE_MS = 10 * 365 * 24 * 3600 * 1000
#: Idle time given to what a consumer that failed (an exception, not a stop) hands back:
#: past any sane lease, so taken at once, but under a year: counted as a delivery, so a
#: message that keeps failing its consumers still becomes poison.
FAILED_IDLE_MS = 30 * 24 * 3600 * 1000


class NameLost(Exception):
    """Another live consumer holds our name: this one went unrenewed for longer than its
    lease (a stall, a partition from Redis) and the name was taken. Pending entries under
    the name are that consumer's now too, so this one stops without releasing them and
    starts again under a name of its own."""


async def renew_forever(
    scripts: Scripts,
    task_type: str,
    identity: Identity,
    flight: Flight,
    held: Mapping[str, Message],
    lease_s: float,
    lost: Callable[[str], None],
) -> None:
    """Every lease/3, reset the idle time of every message we hold (ours only): in flight,
    and waiting in the mailbox (``held``); and keep holding our name
    (``actors.execution.identity``). After an outage the renewal that waited for Redis
    runs as soon as Redis answers. A name found held by another live consumer is
    ``lost`` (given its holder), then ``NameLost`` raised. While Redis refuses the renewal
    (or the name's hold), it is tried again at least every lease/3 too."""
    while True:
        await trio.sleep(lease_s / 3)
        # What we hold is read at each try: a refusal that lasts may see more read or handed
        # over meanwhile (at maxmemory, reads and claims still go through).
        holder = await scripts.client.ride_out(
            functools.partial(
                _renew, scripts, task_type, identity,
                lambda: [*flight.messages, *held], int(lease_s * 1000),
            ),
            refused_cap_s=lease_s / 3,
        )  # fmt: skip
        if holder is not None:
            lost(holder)
            raise NameLost(f"consumer name {identity.name!r} is held by {holder}")


async def _renew(
    scripts: Scripts, task_type: str, identity: Identity, held: Callable[[], list[str]],
    ttl_ms: int,
) -> str | None:  # fmt: skip
    """Renew; the name's holder if it is no longer ours.

    Redis at maxmemory refuses the name's hold (a SET) but not the leases' renewal (XCLAIM
    writes no new data): the leases are renewed all the same before the refusal is waited
    out, so a refusal longer than the lease robs no live consumer (a claimer elsewhere
    would take its running fires and run them again). Nobody can take the name meanwhile:
    that is a refused write too. So with the name's key rejected (another kind of value
    there): the leases are renewed while the rejection is waited out."""
    try:
        ours, holder = await scripts.own_name(task_type, identity.name, identity.owner, ttl_ms)
    except (RedisRefused, ResponseError):
        with contextlib.suppress(RedisRefused, ResponseError):
            await scripts.renew_leases(task_type, identity.name, held())
        raise
    if not ours:
        return holder
    await scripts.renew_leases(task_type, identity.name, held())
    return None


async def release(
    scripts: Scripts,
    task_type: str,
    identity: Identity,
    flight: Flight,
    actor: str,
    log: structlog.typing.FilteringBoundLogger,
    *,
    stopping: bool = True,
) -> None:
    """Hand back everything still pending under our name (unfinished, unstarted, or read by
    an abandoned call), claimable at once elsewhere; leave the group if nothing is pending
    here and no poison this consumer's claimer dead-lettered waits to be ended.
    ``stopping``: the consumer was asked to stop (``RELEASED_IDLE_MS``: no delivery
    counted), else it failed (``FAILED_IDLE_MS``: counted)."""
    consumer = identity.name
    idle_ms = RELEASED_IDLE_MS if stopping else FAILED_IDLE_MS
    released, left = await scripts.release(task_type, consumer, idle_ms)
    await scripts.disown_name(task_type, consumer, identity.owner)
    known = [flight.messages[i] for i in released if i in flight.messages]
    emit_events(actor, [("released", fire_fields(m)) for m in known])
    log.info("consumer_stopped", consumer=consumer, released=len(released), left_group=left)
