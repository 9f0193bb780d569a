"""A consumer's name in its type's group: the same across restarts, never shared by two
live consumers.

A consumer is named after its node (and, in a node's child process, its part):
``n1`` or ``n1.consumers-2``. So a consumer restarted by its supervisor, or a node
restarted after ``kill -9``, comes back under the name its messages are pending under, and
takes them back at once (``recover.lua``) instead of waiting for another node's claimer to
see their lease expire.

The name is held through an owner key (``own_name.lua``: host, pid and a token, refreshed
with the leases, expiring after one lease). A starting consumer takes the name if nobody
holds it, if it holds it already, or if the holder is a process of this host that is gone
(or this very process: an earlier incarnation its supervisor ended). Any other holder is a
live consumer somewhere (two nodes given one name, or replicas sharing a config): then this
one runs under a fresh name of its own and recovers nothing, so no message is ever run by
two live consumers at once.
"""

from __future__ import annotations

import secrets

import attrs
import structlog

from actors.store.scripts import Scripts
from runtime.liveness import holder_is_gone, owner_value


@attrs.frozen
class Identity:
    name: str
    """This consumer's name in the group."""
    owner: str
    """This incarnation's owner value (``host:pid:instance:token``, ``runtime.liveness``)."""
    stable: bool
    """False: the stable name was held by a live consumer elsewhere; this is a fresh one."""


async def take_name(
    scripts: Scripts,
    task_type: str,
    base: str,
    ttl_ms: int,
    log: structlog.typing.FilteringBoundLogger,
) -> Identity:
    """The stable name ``base`` if it is free (see the module), else a fresh one."""
    owner = owner_value()
    ours, holder = await scripts.own_name(task_type, base, owner, ttl_ms)
    if not ours and holder is not None and holder_is_gone(holder):
        ours, holder = await scripts.own_name(task_type, base, owner, ttl_ms, take_from=holder)
    if ours:
        return Identity(base, owner, stable=True)
    fresh = f"{base}-{secrets.token_hex(4)}"
    log.warning("consumer_name_in_use", name=base, holder=holder, using=fresh)
    await scripts.own_name(task_type, fresh, owner, ttl_ms)
    return Identity(fresh, owner, stable=False)
