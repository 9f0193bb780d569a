"""A tick's fires through their tasks' catch-up windows and overlap policies.

After the misfire policy has planned a claimed task's fires (``plan_fires``), two more
rules decide which of them are enqueued, for the tasks whose schedule sets them
(``actors.store.flights.policy_code``; every other task goes straight through):

1. **catch-up window** (``catchup_window_s``): a planned fire whose due time is further
   in the past than the window, on Redis's clock at the claim, is not run (``expired``).
   The misfire policy has chosen the candidates first (so a coalesced fire, standing for
   the latest grid time, is the one the window judges);
2. **overlap** (``overlap``): ``overlap.lua`` decides, atomically with the task's fire in
   flight, which of the rest start now, wait or are skipped, and which running fire a
   ``cancel_other`` fire replaces.

Each fire not run is one ``not_run`` line (reason ``overlap`` or ``expired``), counted in
``metronome_fires_not_run_total``, and noted on the task for ``explain``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs

from actors.domain.schedules import FirePlan
from actors.store.flights import Decision, Planned, parse_policy, task_policy_code
from actors.store.keys import schedule_id
from actors.store.replies import Claimed, Fire
from actors.store.scripts import Scripts


@attrs.define
class PolicyFires:
    """What a tick enqueues once the policies have spoken."""

    fires: list[Fire] = attrs.field(factory=list)
    cancels: dict[str, list[str]] = attrs.field(factory=lambda: defaultdict(list))
    """Per type, the schedule ids of fires a ``cancel_other`` fire replaced."""
    not_run: list[tuple[str, dict[str, Any]]] = attrs.field(factory=list)
    """``not_run`` lines."""
    commits: dict[str, tuple[int | None, int | None, int]] = attrs.field(factory=dict)
    """Per task whose commit differs from its plan's: (next grid time, score, fires)."""


#: The letter a woken task of no overlap policy of its own is decided under.
WAKE_LETTER = "B"
#: How long a task whose grid ended stays scheduled while fires wait to start, if no end of
#: its fire in flight wakes it sooner (a safety net: each end wakes it at once).
PARK_MS = 3_600_000


def _not_run(task: Claimed, due: int, reason: str, blocking: int | None) -> tuple[str, Any]:
    fields: dict[str, Any] = {
        "task_id": task.task_id, "schedule_id": schedule_id(task.task_id, due),
        "type": task.type, "due_ms": due, "reason": reason,
    }  # fmt: skip
    if blocking is not None:
        fields["blocking"] = schedule_id(task.task_id, blocking)
    return ("not_run", fields)


async def apply_policies(
    scripts: Scripts,
    token: str,
    now_ms: int,
    planned: list[tuple[int, Claimed, FirePlan]],
) -> PolicyFires:
    """The fires of ``planned`` (partition, task, plan) that run, for tasks with a policy;
    ``overlap.lua`` is called only if one of them has an overlap policy or an expired
    fire. A repeat (same ``token``) decides the same again."""
    out = PolicyFires()
    asked: dict[int, list[Planned]] = defaultdict(list)
    tasks: dict[str, Claimed] = {}
    plans: dict[str, FirePlan] = {}
    priors: dict[int, str] = {}
    fires = out.fires
    for partition, task, plan in planned:
        s = task.schedule
        woken = task.due_ms > now_ms  # to start a fire waiting for its flight (see below)
        if (
            not woken
            and s.overlap == "allow_all"
            and s.catchup_window_s is None
            and s.pause_after_failures is None
        ):
            # No policy (most tasks): as plain as before; no schedule hashed per fire.
            fires += [Fire(task.task_id, task.type, task.payload, d, 0, task.prior_claim)
                      for d in plan.fires]  # fmt: skip
            continue
        code = task_policy_code(s, task.task_id)
        policy = parse_policy(code)
        dues, expired = list(plan.fires), []
        if policy.window_ms is not None:
            expired = [d for d in dues if policy.expired(d, now_ms)]
            dues = [d for d in dues if not policy.expired(d, now_ms)]
        if policy.tracked or expired or woken:
            # A woken task of no policy has fires waiting that an operator's trigger or
            # backfill held back: they start under buffer_all's rule, and are tracked.
            letter = policy.letter if policy.tracked else WAKE_LETTER
            ends = plan.next_ms is None
            asked[partition].append(Planned(task.task_id, letter, dues, expired, ends))
            tasks[task.task_id] = task
            plans[task.task_id] = plan
            priors[partition] = task.prior_claim
        else:
            out.fires += [
                Fire(task.task_id, task.type, task.payload, d, prior=task.prior_claim, policy=code)
                for d in dues
            ]
    if not asked:
        return out
    decisions = await scripts.decide_overlaps(token, priors, asked)
    for items in asked.values():
        for item in items:
            task = tasks[item.task_id]
            decision = decisions[item.task_id]
            _adjust_commit(out, task, plans[task.task_id], decision, now_ms)
            code = task_policy_code(task.schedule, task.task_id)
            if item.letter != code[:1]:  # woken, no policy of its own: tracked as it started
                code = item.letter + code[1:]
            out.fires += [
                Fire(task.task_id, task.type, task.payload, d, prior=task.prior_claim,
                     policy=code, fresh=fresh)
                for d, fresh in decision.run
            ]  # fmt: skip
            out.cancels[task.type] += [schedule_id(task.task_id, d) for d in decision.cancel]
            out.not_run += [_not_run(task, d, "overlap", decision.blocking)
                            for d in decision.skipped]  # fmt: skip
            out.not_run += [_not_run(task, d, "expired", None) for d in item.expired]
    return out


def _adjust_commit(
    out: PolicyFires, task: Claimed, plan: FirePlan, decision: Decision, now_ms: int
) -> None:
    """A commit other than the plan's: due times decided by an earlier claim are not
    counted again; a task whose grid ended with fires waiting stays scheduled, parked at
    its last grid time, until they have started (``end_flights.lua`` wakes it)."""
    fired = len(plan.fires) - decision.before
    if decision.park is not None:
        out.commits[task.task_id] = (decision.park, now_ms + PARK_MS, fired)
    elif decision.before:
        out.commits[task.task_id] = (plan.next_ms, None, fired)
