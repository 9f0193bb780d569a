"""A poller tick's writes: its fires appended to their streams, then its claims committed.

One round trip on a single server with the dedupe window on (each commit checks that every
enqueue call of the claim left its marker), else two: in a Redis Cluster (the streams and
the partitions live on different shards) or without markers, the commit waits for the
enqueue's reply, each ridden out alone (without markers a repeated enqueue appends again).

With the dedupe window on, a type whose stream Redis rejects holds back its own tasks
only (``actors.scheduling.rejections``): the other types' fires are appended (type by type,
their markers making the repeat of a call that went through answer as before) and
committed, and the held tasks' commits move nothing but their score, a claim lease on
(``held_commit``; the claim is kept in flight when a held type took several calls, for a
later claim of a held task to find what this one appended). Claimed again then, a held
task's grid times are planned again like any late task's (its misfire policy and catch-up
window apply), and a fire a policy put in flight for it is appended by its next decision,
however late. Without the window (no markers) a rejection is waited out, every type with
it.

A partition whose commit Redis rejects (its keys of another kind) is returned apart with
that commit (``TickWrites.aside``, ``unsent``): its fires are in the streams and its claim
in flight; the poller sets it aside and sends the same commit again before it claims the
partition again (a commit that partly ran finds the states it wrote), so nothing of it is
appended twice. Every other partition's commit goes through.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from actors.scheduling.rejections import (
    Notices,
    Rejected,
    append_by_type,
    commit_apart,
    unless_rejected,
)
from actors.scheduling.tick_plan import TickPlan, hold_back
from actors.store.enqueue import enqueue_and_commit_fires, enqueue_fires
from actors.store.flights import end_dropped_flights
from actors.store.replies import Commit, Fire, FireCommit
from actors.store.scheduling_scripts import ENQUEUE_CHUNK
from actors.store.scripts import Scripts
from runtime.redis_io import ResponseError
from runtime.redis_replies import PartRejected


@attrs.frozen
class Tick:
    """What a tick writes: its claim's token, plan, fires and commits, each partition's
    count of writes as the claim read it, and the types' earlier claims committed in full
    (their markers go with this enqueue: ``CommittedClaims``)."""

    token: str
    plan: TickPlan
    fires: list[Fire]
    commits: dict[int, list[FireCommit]]
    writes: dict[int, int]
    committed: Mapping[str, Sequence[str]]


@attrs.frozen
class TickWrites:
    """What the commits did, the commits as sent (a held task's changed; a partition set
    aside left out), the fires appended (a held type's left out), the tasks held back,
    and the partitions whose commit Redis rejected."""

    done: dict[int, Commit]
    commits: dict[int, list[FireCommit]]
    appended: list[Fire]
    held: set[str]
    """The tasks held back."""
    kept: bool
    """Whether the claim stays in flight (``hold_back``'s ``keep``, or a partition set
    aside)."""
    aside: list[PartRejected]
    """The partitions whose commit Redis rejected: their fires appended."""
    unsent: dict[int, list[FireCommit]]
    """Their commits, as sent: to be sent again before they are claimed again."""


async def enqueue_and_commit(
    scripts: Scripts, actor: str, poller: str, window_ms: int, lease_ms: int,
    notices: Notices, tick: Tick,
) -> TickWrites:  # fmt: skip
    """Append ``tick``'s fires and commit its claims (see the module); a fire whose copy
    was appended already ends its flight. ``window_ms``: the dedupe window; ``lease_ms``:
    the claim lease, how long a held task waits."""
    redis = scripts.client
    token, now, fires, commits = tick.token, tick.plan.now_ms, tick.fires, tick.commits
    dropped: list[Fire] = []

    async def append(group: list[Fire]) -> int:
        return await enqueue_fires(
            scripts, group, now, actor, window_ms, token, tick.committed, dropped
        )

    rejected: dict[str, ResponseError] = {}
    held: set[str] = set()
    kept = False
    done: dict[int, Commit] | None = None
    aside: list[PartRejected] = []
    unsent: dict[int, list[FireCommit]] = {}
    if fires and scripts.commits_with_enqueue(window_ms):
        try:
            done, aside = await redis.ride_out(
                functools.partial(unless_rejected, lambda: enqueue_and_commit_fires(
                    scripts, fires, now, actor, window_ms, token, tick.committed, poller,
                    commits, tick.writes, dropped,
                ))
            )  # fmt: skip
            unsent = {a.part: commits[a.part] for a in aside}
        except Rejected:  # the calls again type by type (a call that went through answers
            # from its marker), then the commits alone (one that ran finds its states)
            rejected = await append_by_type(redis, append, fires, at_once=False)
    elif fires and window_ms > 0:
        rejected = await append_by_type(redis, append, fires, at_once=True)
    elif fires:  # no markers: a call repeated appends again, so a rejection is waited out
        await redis.ride_out(lambda: append(fires))
    notices.say("type", rejected, (f.type for f in fires))
    if rejected:
        held = {f.task_id for f in fires if f.type in rejected}
        # A type appended in several calls may have had one go through before another was
        # rejected: then the claim stays in flight, for the held tasks' next claim to find
        # what it appended (a type rejected whole, WRONGTYPE, leaves nothing: it need not).
        by_type = Counter(f.type for f in fires if f.type in rejected)
        kept = any(count > ENQUEUE_CHUNK for count in by_type.values())
        commits = hold_back(commits, tick.plan.plans, dict.fromkeys(held, lease_ms), kept)
        fires = [f for f in fires if f.type not in rejected]
    if done is None:
        done = {}
        if commits:  # a partition Redis rejects is set aside
            done, aside = await commit_apart(scripts, poller, token, commits, tick.writes)
            unsent = {a.part: commits[a.part] for a in aside}
    parts = {a.part for a in aside}
    commits = {p: c for p, c in commits.items() if p not in parts}
    done = {p: d for p, d in done.items() if p not in parts}
    await end_dropped_flights(scripts, dropped)
    return TickWrites(done, commits, fires, held, kept or bool(aside), aside, unsent)
