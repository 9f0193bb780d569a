"""Garbage-collector settings for a node's processes: rare young collections, and nothing
that was alive at start-up walked again.

A busy node allocates a few dozen container objects a fire (stream replies, messages,
outcomes, lifecycle fields), nearly all freed at once by reference counting. CPython's
default thresholds (700, 10, 10) still run a young collection every 700 net allocations,
and every few seconds a full one that walks the whole heap: at 10,000 fires/s (`python -m
bench fire 100000 10 40 --processes 1`, timed with ``gc.callbacks``) the consumer process
spent 2.7 s of 48 in the collector, the scheduler 0.9 s, with pauses up to 70 ms: most of
the p99 start lag.

So once the node is built, everything alive (modules, configuration, the actor tree) is
frozen out of collection (``gc.freeze``), and a young collection waits for
``YOUNG_THRESHOLD`` net allocations. Reference cycles are still collected, only later: at
most that many young objects wait for it (a few MB). Measured with it: no collection at
all in the same run, p99 start lag 52-83 ms -> 29-32 ms.
"""

from __future__ import annotations

import gc

#: Net allocations of container objects between young collections (CPython's default: 700).
YOUNG_THRESHOLD = 50_000


def tune() -> None:
    """Apply the policy to this process; call once it is built, before it starts work."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
