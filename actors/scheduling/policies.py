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
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.domain.misfires import FirePlan
from actors.store.flights import Planned, parse_policy, task_policy_code, with_origin
from actors.store.history import DEFAULT_HISTORY
from actors.store.keys import schedule_id
from actors.store.manual_fires import is_grid_time
from actors.store.replies import Claimed, Fire
from actors.store.scripts import Scripts
from runtime.redis_replies import PartRejected


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
    parked: set[str] = attrs.field(factory=set)
    """Tasks this claim parked (their grid ended with fires waiting): their commit marks
    the park time counted (``FireCommit.parked``)."""
    tracked: set[str] = attrs.field(factory=set)
    """Tasks this claim decided for (``overlap.lua``): their commit confirms the appends."""
    waits: dict[str, int] = attrs.field(factory=dict)
    """Tasks not decided for (``Decision.wait_ms``), by how long they wait: their commit
    holds them back that long, their grid where it was."""
    rejected: list[PartRejected] = attrs.field(factory=list)
    """Partitions whose decisions Redis rejected: their tasks left out (no fire, no line),
    for the poller to set aside."""


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


def _held(task: Claimed, letter: str, due_ms: int) -> str:
    """The policy code of an operator's fire held back behind the task's fire in flight,
    started now: the policy's letter alone (no catch-up window, no failure count) and its
    origin, which its waiting mark does not keep: a backfill's time is a grid time, a
    trigger's never is (``is_grid_time``). Without it, it would be told as a scheduled
    fire, and judged late by however long it waited."""
    s = task.schedule
    anchor = s.start_ms if s.start_ms is not None else task.due_ms  # parked on now: off it
    origin = "b" if is_grid_time(s, anchor, due_ms) else "t"
    return with_origin(letter, origin)


def _plain(task: Claimed, dues: Sequence[int], code: str = "") -> list[Fire]:
    return [Fire(task.task_id, task.type, task.payload, d, 0, task.prior_claim, code) for d in dues]


async def apply_policies(
    scripts: Scripts,
    token: str,
    now_ms: int,
    planned: list[tuple[int, Claimed, FirePlan]],
    history: int = DEFAULT_HISTORY,
    takeover_ms: int = 0,
    writes: Mapping[int, int] | None = None,
) -> PolicyFires:
    """The fires of ``planned`` (partition, task, plan) that run; ``overlap.lua`` is
    called only if a task has an overlap policy or an expired fire. A repeat (same
    ``token``) decides the same again. ``writes``: each partition's count of API writes
    as claimed (a task changed since is not decided for: ``decide_overlaps``)."""
    out = PolicyFires()
    asked: dict[int, list[Planned]] = defaultdict(list)
    claimed: dict[str, tuple[Claimed, FirePlan, str]] = {}
    for partition, task, plan in planned:
        s = task.schedule
        if s.overlap == "allow_all" and s.catchup_window_s is None:
            # No overlap policy, no window (most tasks): no schedule hashed per fire.
            plain = s.pause_after_failures is None and not s.spread_s and not s.jitter_s
            code = "" if plain else task_policy_code(s, task.task_id, task.created_ms)
            out.fires += _plain(task, plan.fires, code)
            continue
        code = task_policy_code(s, task.task_id, task.created_ms)
        policy = parse_policy(code)
        dues: list[int] = []
        expired: list[int] = []
        for d in plan.fires:
            (expired if policy.expired(d, now_ms) else dues).append(d)
        if not policy.tracked:  # allow_all: the fires in time run; the expired are noted
            out.fires += _plain(task, dues, code)
            dues = []
        if policy.tracked or expired:
            ends = plan.next_ms is None
            item = Planned(
                task.task_id, policy.letter, dues, expired, ends, task.type, task.updated_ms
            )
            asked[partition].append(item)
            claimed[task.task_id] = (task, plan, code)
    if not asked:
        return out
    decisions = await scripts.decide_overlaps(
        token, asked, history=history, takeover_ms=takeover_ms, rejected=out.rejected,
        writes=writes,
    )  # fmt: skip
    gone = {r.part for r in out.rejected}
    if gone:  # their plain fires too: the partition is claimed and planned again later
        partition_of = scripts.keys.partition_of
        out.fires = [f for f in out.fires if partition_of(f.task_id) not in gone]
    for partition, items in asked.items():
        if partition in gone:
            continue
        for item in items:
            task, plan, code = claimed[item.task_id]
            decision = decisions[item.task_id]
            if decision.wait_ms is not None:
                # a claim that plans no fire of a task still on its grid (woken before its
                # grid time, or every missed time skipped) waits at most until the claim of
                # its next grid time would come (its spread in): that time is claimed as it
                # would have been, and the wait goes on with its decision
                wait = decision.wait_ms
                if not plan.fires and plan.next_ms is not None:
                    due = task.schedule.fire_ms(plan.next_ms, task.task_id)
                    wait = max(1, min(wait, due - now_ms))
                out.waits[task.task_id] = wait
                continue
            if item.letter != "A":
                out.tracked.add(task.task_id)
            fired = len(plan.fires) - decision.counted
            if decision.park is not None:
                out.commits[task.task_id] = (decision.park, now_ms + PARK_MS, fired)
                out.parked.add(task.task_id)
            elif decision.counted:
                out.commits[task.task_id] = (plan.next_ms, None, fired)
            out.fires += [
                Fire(task.task_id, task.type, task.payload, d, prior=task.prior_claim,
                     policy=_held(task, item.letter, d) if d in decision.manual else code,
                     fresh=fresh)
                for d, fresh in decision.run
            ]  # fmt: skip
            out.cancels[task.type] += [schedule_id(task.task_id, d) for d in decision.cancel]
            out.not_run += [_not_run(task, d, "overlap", decision.blocking)
                            for d in decision.skipped]  # fmt: skip
            out.not_run += [
                _not_run(task, d, "expired", None) for d in item.expired if d not in decision.known
            ]
    return out
