"""The node's Prometheus metrics, counted from the lifecycle events the roles log.

``count_events`` is registered with ``runtime.logging.observe_events`` when a node starts
(``install``): every ``queued``, ``running``, ``finished``, ``retried``, ``dead``,
``misfired``, ``duplicate_dropped``, ``reclaimed`` event and every actor restart or
give-up becomes a sample, so the metrics say what the audit log says. Labels are the
task type, an outcome or reason from a fixed set, or an actor path (the tree's shape):
never a task id, so cardinality stays bounded. docs/OBSERVABILITY.md lists every metric.
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import Counter, Histogram

from runtime.logging import Events, observe_events

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

ENQUEUED = Counter(
    "metronome_fires_enqueued_total",
    "Fires appended to their type's stream, by attempt (first run or a retry).",
    ["type", "attempt"],
)
STARTED = Counter("metronome_fires_started_total", "Handler runs started.", ["type"])
FINISHED = Counter(
    "metronome_fires_finished_total",
    "Handler runs ended, by outcome: ok, retried (a retry is scheduled) or dead (to the DLQ).",
    ["type", "outcome"],
)
TIMEOUTS = Counter(
    "metronome_fire_timeouts_total",
    "Handler runs stopped at their type's timeout_s (also counted as retried or dead).",
    ["type"],
)
RETRIES = Counter(
    "metronome_retries_scheduled_total", "Retries scheduled after a failed run.", ["type"]
)
DEAD = Counter(
    "metronome_dead_letters_total",
    "Messages moved to the DLQ, by reason: failed (attempts used up), unrecoverable, "
    "poison (delivered max_deliveries times) or malformed.",
    ["type", "reason"],
)
MISFIRES = Counter(
    "metronome_misfires_total",
    "Claims that found grid times missed while nothing ran, by misfire policy.",
    ["type", "policy"],
)
NOT_RUN = Counter(
    "metronome_fires_not_run_total",
    "Missed grid times that were not fired, by reason: coalesced, skipped or capped "
    "(fire_all beyond misfire_cap).",
    ["type", "reason"],
)
DUPLICATES = Counter(
    "metronome_duplicates_dropped_total",
    "Fires dropped as duplicates (enqueued or started again within the dedupe window).",
    ["type"],
)
RECLAIMS = Counter(
    "metronome_reclaims_total",
    "Messages taken over from a consumer that stopped renewing them (died).",
    ["type"],
)
START_LAG = Histogram(
    "metronome_start_lag_seconds",
    "From a fire's due time to its handler's start.",
    ["type"],
    buckets=_LAG_BUCKETS,
)
DURATION = Histogram(
    "metronome_handler_duration_seconds",
    "Handler run time, whatever the outcome.",
    ["type"],
    buckets=_DURATION_BUCKETS,
)
RESTARTS = Counter("metronome_actor_restarts_total", "Actor restarts by its supervisor.", ["actor"])
GIVE_UPS = Counter(
    "metronome_actor_give_ups_total",
    "Supervisors that gave up on a child (restart intensity or attempts exceeded).",
    ["actor"],
)

_NOT_RUN_REASON = {"coalesce": "coalesced", "skip": "skipped", "fire_all": "capped"}


def count_events(actor: str, events: Events) -> None:
    """Turn one batch of logged events into samples (counts summed per label first)."""
    tally: Tally[tuple[Any, ...]] = Tally()
    for event, fields in events:
        kind = fields.get("type", "")
        if event == "queued":
            tally[(ENQUEUED, kind, "first" if not fields.get("attempt") else "retry")] += 1
        elif event == "running":
            tally[(STARTED, kind)] += 1
            START_LAG.labels(kind).observe(max(0, fields.get("start_lag_ms", 0)) / 1000)
        elif event in ("finished", "retried") or (event == "dead" and "duration_ms" in fields):
            outcome = {"finished": "ok", "retried": "retried"}.get(event, "dead")
            tally[(FINISHED, kind, outcome)] += 1
            DURATION.labels(kind).observe(max(0, fields.get("duration_ms", 0)) / 1000)
            if str(fields.get("error", "")).startswith("timeout:"):
                tally[(TIMEOUTS, kind)] += 1
            if event == "retried":
                tally[(RETRIES, kind)] += 1
            elif event == "dead":
                tally[(DEAD, kind, fields.get("reason", "failed"))] += 1
        elif event == "dead":  # poison or malformed: no handler ran this time
            tally[(DEAD, kind, fields.get("reason", "poison"))] += 1
        elif event == "misfired":
            policy = str(fields.get("policy", ""))
            tally[(MISFIRES, kind, policy)] += 1
            missed = int(fields.get("missed", 0))  # grid times not fired one by one
            if missed > 0:
                tally[(NOT_RUN, kind, _NOT_RUN_REASON.get(policy, policy))] += missed
        elif event == "duplicate_dropped":
            tally[(DUPLICATES, kind)] += 1
        elif event == "reclaimed":
            tally[(RECLAIMS, kind)] += 1
        elif event == "actor_restarting":
            tally[(RESTARTS, actor)] += 1
        elif event == "actor_gave_up":
            tally[(GIVE_UPS, f"{actor}/{fields.get('child', '?')}")] += 1
    for (metric, *labels), n in tally.items():
        metric.labels(*labels).inc(n)


def install() -> None:
    """Count this process's events from now on (idempotent)."""
    observe_events(count_events)
