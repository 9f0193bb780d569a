"""Who serves each partition, and how far behind it is: ``GET /v1/partitions`` and the
dashboard's node view.

Read straight from the partitions' owner hashes and schedules (``{ns:P}:poller``,
``{ns:P}:schedule``): one pipeline of three cheap commands per partition, nothing kept.
A partition with no live owner and tasks due is one no poller serves (a scheduler node is
down, or every node runs ``pollers = 0``); one whose owner is live but with many tasks due
is one whose poller falls behind.
"""

from __future__ import annotations

from typing import Any

from actors.store.queue_rows import score_ms, stored_number
from actors.store.tasks import TaskStore


def partition_owner(poller: bytes | None, until: bytes | None, now_ms: int) -> dict[str, Any]:
    """A partition's owner from its owner hash's ``poller`` and ``until`` fields (a lease
    end that is not a whole number, another program's, read as none)."""
    lease_until = stored_number(until) if poller and until else None
    return {
        "poller": poller.decode(errors="replace") if poller else None,
        "lease_until_ms": lease_until,
        "live": lease_until is not None and lease_until > now_ms,
    }


async def read_partitions(store: TaskStore) -> dict[str, Any]:
    """Per partition: its owner (poller id or None), lease end, whether the lease holds,
    claims in flight, tasks due now and the earliest due time; and the live pollers."""
    keys = await store.keys()
    now = await store.now_ms()
    calls: list[tuple[Any, ...]] = [("ZRANGE", keys.pollers, now, "+inf", "BYSCORE")]
    for p in range(keys.partitions):
        calls += [
            ("HMGET", keys.partition_owner(p), "poller", "until", "inflight"),
            ("ZCOUNT", keys.schedule(p), "-inf", now),
            ("ZRANGE", keys.schedule(p), 0, 0, "WITHSCORES"),
        ]
    replies = await store.client.reads(calls)  # a key of another kind: redis_rejected
    pollers = sorted(m.decode(errors="replace") for m in replies[0])
    rows = []
    for p in range(keys.partitions):
        (poller, until, inflight), due, first = replies[1 + 3 * p : 4 + 3 * p]
        rows.append(
            {
                "partition": p,
                **partition_owner(poller, until, now),
                "claims_in_flight": len((inflight or b"").split()),
                "due_now": int(due),
                "next_due_ms": score_ms(first[0][1]) if first else None,
            }
        )
    return {"now_ms": now, "pollers": pollers, "partitions": rows}
