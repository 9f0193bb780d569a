"""What a poller's tick makes of its claims before anything is written: each claimed
task's fires under its misfire policy, the lines that say so, and the commit that moves
its grid on once the fires are in the stream. Pure: no Redis, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import attrs

from actors.domain.misfires import FirePlan, plan_fires
from actors.store.history import COALESCED, DEFAULT_HISTORY, MISFIRE_SKIPPED
from actors.store.keys import schedule_id
from actors.store.replies import Claimed, FireCommit, PartitionClaim, fire_commit, held_commit

#: A lifecycle line: its event name and fields (``runtime.logging.emit_events``).
Line = tuple[str, dict[str, Any]]


@attrs.define
class TickPlan:
    """The fires a tick's claims plan, before the policies decide which of them run."""

    now_ms: int
    """Redis's clock at the latest claim (0 when nothing was claimed)."""
    plans: dict[int, list[tuple[Claimed, FirePlan]]]
    """Per partition, each claimed task with its plan: what its commit starts from."""
    planned: list[tuple[int, Claimed, FirePlan]]
    """The same as (partition, task, plan), in claim order: what the policies judge."""
    scheduled: list[Line]
    """``scheduled`` debug lines, one per claimed task (only when debug lines are on)."""
    misfired: list[Line]
    """``misfired`` lines, one per task that missed grid times."""


def plan_fire(task: Claimed, now_ms: int) -> FirePlan:
    """The misfire policy's plan for a claimed task; none for a task claimed before its
    grid time (woken to start a fire waiting behind one that ended: ``overlap.lua``).

    Times owed after a takeover (``owed_until_ms``: the old lease's end plus a lease, at
    most) start, for a task written (created, or its schedule changed) after the old
    owner last took or renewed its lease (``owed_from_ms``), there: no claim before it
    read the task, and any claim after it applied the policy to the times it found
    missed. A task written earlier is owed every time from its due one: the old owner
    may itself have owed it times it never committed (a takeover before it), which a
    plan from the renewal would put under the policy. Unknown (None), every time from
    the due one is owed."""
    if task.due_ms > now_ms:
        return FirePlan((), task.due_ms)
    s = task.schedule
    slack = s.slack_ms(task.task_id) if s.spread_s or s.jitter_s else 0
    owed, owed_from = task.owed_until_ms, task.owed_from_ms
    if owed is None or owed_from is None or task.updated_ms <= owed_from:
        owed_from = None
    return plan_fires(
        s, task.due_ms, now_ms, task.fires, owed_until_ms=owed, slack_ms=slack,
        owed_from_ms=owed_from,
    )  # fmt: skip


def _scheduled(task: Claimed) -> Line:
    return (
        "scheduled",
        {
            "task_id": task.task_id,
            "schedule_id": schedule_id(task.task_id, task.due_ms),
            "type": task.type,
            "due_ms": task.due_ms,
        },
    )


def _misfired(task: Claimed, plan: FirePlan) -> Line:
    return (
        "misfired",
        {
            "task_id": task.task_id,
            "schedule_id": schedule_id(task.task_id, task.due_ms),
            "type": task.type,
            "policy": task.schedule.misfire,
            "missed": plan.missed,
            "fired": len(plan.fires),
            "due_ms": task.due_ms,
        },
    )


def plan_claims(claims: list[PartitionClaim], debug: bool) -> TickPlan:
    """Plan every claimed task's fires on Redis's clock at its claim (``plan_fire``). The
    ``scheduled`` lines are built only with ``debug`` on: one per claimed task is too many
    otherwise."""
    now = max(c.now_ms for c in claims) if claims else 0
    out = TickPlan(now, defaultdict(list), [], [], [])
    for claim in claims:
        for task in claim.tasks:
            if debug:
                out.scheduled.append(_scheduled(task))
            plan = plan_fire(task, claim.now_ms)
            out.plans[claim.partition].append((task, plan))
            out.planned.append((claim.partition, task, plan))
            if plan.missed:  # every missed time is said, the grid's last ones too
                out.misfired.append(_misfired(task, plan))
    return out


def plan_commits(
    plans: dict[int, list[tuple[Claimed, FirePlan]]],
    changed: dict[str, tuple[int | None, int | None, int]],
    tracked: set[str],
    history: int = DEFAULT_HISTORY,
    parked: frozenset[str] | set[str] = frozenset(),
) -> dict[int, list[FireCommit]]:
    """Each claimed task's commit: its grid moved on to the plan's next time (with the
    task's spread and that time's jitter in the score) and its fires counted, or as the
    policies ``changed`` it (next grid time, score or None for the usual one, fires);
    the ``tracked`` tasks' commits confirm the fires their claim put in flight, and a
    task that missed grid times gets one history entry for them (``history`` kept)."""
    out: dict[int, list[FireCommit]] = {}
    for partition, items in plans.items():
        commits = out[partition] = []
        for task, plan in items:
            next_ms, score, fired = changed.get(task.task_id, (plan.next_ms, None, len(plan.fires)))
            if score is None and next_ms is not None:
                score = task.schedule.score_ms(next_ms, task.task_id)
            commit = fire_commit(task, next_ms, score, fired)
            commit.confirm = task.task_id in tracked
            commit.parked = task.task_id in parked
            if plan.missed:
                fate = COALESCED if task.schedule.misfire == "coalesce" else MISFIRE_SKIPPED
                commit.misfire = (fate, task.type, history)
            commits.append(commit)
    return out


def hold_back(
    commits: dict[int, list[FireCommit]],
    plans: dict[int, list[tuple[Claimed, FirePlan]]],
    holds: Mapping[str, int],
    keep: bool = False,
) -> dict[int, list[FireCommit]]:
    """``commits`` with those of the tasks in ``holds`` (whose fires Redis would not take,
    or that wait for another decider's fire) held back their time, in ms (``held_commit``;
    ``keep``: the claim stays in flight)."""
    claimed = {task.task_id: task for items in plans.values() for task, _ in items}
    return {
        p: [
            held_commit(claimed[c.task_id], holds[c.task_id], keep) if c.task_id in holds else c
            for c in items
        ]
        for p, items in commits.items()
    }
