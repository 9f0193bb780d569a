"""Partition ownership: which partitions a poller serves.

Each partition is served by one poller at a time. A poller owns a partition by a lease in
the partition's owner hash, taken and renewed by every claim (``claim_due.lua``) and fenced
at commit (``commit_fires.lua``), so pollers never compete for the same due tasks and a
claim writes nothing per task. Who should own what is computed, not negotiated: every
poller says it is alive in the namespace's pollers zset (``poller_members.lua``, with a
time to live of one claim lease) and reads the sorted list of live pollers; the poller at
rank ``r`` of ``n`` wants the partitions ``p`` with ``p % n == r``. Pollers that read the
same list want disjoint sets covering every partition; while their views differ (a poller
just came or went), the leases decide, and the views agree again within one refresh.

- A poller that comes: the others see it at their next refresh and release what is now
  its (``release_partition.lua``, between ticks, so nothing is left uncommitted); it takes
  those partitions at its next tick.
- A poller that dies: its membership and its leases run out within one claim lease; the
  others then want its partitions and take them over, owing every fire due until then
  (``claim_due.lua``: owed), so a handover makes fires late, never missed. A poller whose
  holder is a process of its own host that has exited (a killed scheduler process, a node
  restarted after ``kill -9``) takes over at once (``runtime.liveness``).
- A poller that stops: it releases its partitions and leaves, so they are taken at once.
"""

from __future__ import annotations

from collections.abc import Collection

import structlog
import trio

from actors.store.scripts import Scripts
from runtime.errors import RedisUnavailable
from runtime.redis_io import ResponseError

#: How long a stopping poller tries to hand its partitions back (then their leases expire):
#: a quarter to send a commit Redis rejected once more, half to let calls cut off settle,
#: the rest to release.
LEAVE_S = 2.0


def wanted_partitions(poller: str, members: list[str], partitions: int) -> list[int]:
    """The partitions ``poller`` should own when ``members`` (sorted) are the live pollers;
    all of them when it does not know of any (it has not said it is alive yet)."""
    if poller not in members:
        members = sorted([*members, poller])
    rank, n = members.index(poller), len(members)
    return [p for p in range(partitions) if p % n == rank]


class Membership:
    """When a poller next says it is alive, and what it wants from the last list it read."""

    def __init__(self, poller: str, partitions: int, lease_ms: int) -> None:
        self.poller = poller
        self.partitions = partitions
        self.ttl_ms = lease_ms
        #: Often enough that a poller stays listed, and a newcomer is seen, well within a lease.
        self.refresh_s = max(0.05, min(0.5, lease_ms / 3000))
        self.members: list[str] = [poller]
        self.wanted = list(range(partitions))
        self._next_refresh = float("-inf")

    def due(self) -> bool:
        return trio.current_time() >= self._next_refresh

    def update(self, members: list[str]) -> bool:
        """Record a fresh list of live pollers; True if what this poller wants changed."""
        self._next_refresh = trio.current_time() + self.refresh_s
        self.members = members
        wanted = wanted_partitions(self.poller, members, self.partitions)
        changed = wanted != self.wanted
        self.wanted = wanted
        return changed


async def hand_back(
    scripts: Scripts, poller: str, owned: Collection[int],
    log: structlog.typing.FilteringBoundLogger,
) -> bool:  # fmt: skip
    """A stopping poller's ``owned`` partitions handed back, and the poller gone from the
    list of pollers, so others take over at once; best effort (otherwise the leases run
    out). Whether they were.

    Ordering: first every Redis call abandoned on cancellation must have ended. An
    enqueue cut off mid-call may still land; released before it did, the partition's
    next owner could claim the same grid times and append them before it (a fire
    twice). Past ``LEAVE_S / 2``, or with a call still unanswered after the socket
    timeout (a paused server), nothing is released: the leases run out instead."""
    settled = False
    with trio.move_on_after(LEAVE_S / 2):
        settled = await scripts.client.wait_abandoned()
    if not settled:
        log.warning("partitions_not_released", error="a call cut off is still running")
        return False
    try:
        released = await scripts.release_partitions(sorted(owned), poller)
        await scripts.poller_members(poller, 0)
    except (RedisUnavailable, ResponseError) as exc:  # an owner hash rejected: the same
        log.warning("partitions_not_released", error=str(exc))
        return False
    log.info("partitions_released", partitions=released)
    return True
