"""The node's Prometheus metrics, counted from the lifecycle events the roles log.

``count_events`` is registered with ``runtime.logging.observe_events`` when a node starts
(``install``): every ``queued``, ``running``, ``finished``, ``retried``, ``dead``,
``misfired``, ``not_run``, ``duplicate_dropped``, ``reclaimed`` event (the first three
as one summary a batch: ``fires_queued`` and ``runs_started`` where their debug lines are
off, and ``runs_finished`` always), every step Redis refused (``redis_refused``, from
``runtime.redis_io``; ``fires_held_back``, ``retries_held_back``,
``completions_held_back`` and ``cancels_not_sent``, held back or left out rather than
waited on, count as rejected)
and every actor restart or give-up becomes a sample, so the
metrics say what the audit log says (within about 0.25 s, where a ``MetricsWriter``
gathers the writes). Labels are the task type, an outcome or reason from a fixed set, or
an actor path (the tree's shape): never a task id, so cardinality stays bounded.
docs/OBSERVABILITY.md lists every metric.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter as Tally
from collections.abc import Iterable
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
    "Handler runs ended, by outcome: ok, retried (a retry is scheduled), dead (to the DLQ) "
    "or cancelled (by a newer fire of its cancel_other task).",
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
    "Fires due and not run, by reason: overlap (one was still in flight), expired (later "
    "than the catch-up window), stopped and updated (waiting behind one in flight when the "
    "task was stopped, or given a schedule without an overlap policy), misfire_skip, "
    "coalesced, misfire_cap (fire_all beyond misfire_cap), other.",
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
REDIS_REFUSALS = Counter(
    "metronome_redis_refusals_total",
    "Steps Redis refused and that wait to be repeated, by kind: refused_write (OOM, "
    "MISCONF, NOREPLICAS), permission (NOPERM, a disabled command) or rejected (also a "
    "type's stream or a partition rejected, whose fires or retries are held back).",
    ["kind"],
)
RESTARTS = Counter("metronome_actor_restarts_total", "Actor restarts by its supervisor.", ["actor"])
GIVE_UPS = Counter(
    "metronome_actor_give_ups_total",
    "Supervisors that gave up on a child (restart intensity or attempts exceeded).",
    ["actor"],
)

#: The kinds of refusal and reasons of dead letters a series is laid down for at 0.
REFUSAL_KINDS = ("refused_write", "permission", "rejected")
DEAD_REASONS = ("failed", "unrecoverable", "poison", "malformed")


def declare_series(types: Iterable[str]) -> None:
    """Lay down at 0 the series the alerts watch with ``increase()``, which never sees a
    series' first count: Redis refusals by kind, and the dead letters of ``types`` by
    reason (a first dead letter, a first refusal would go unseen)."""
    for kind in REFUSAL_KINDS:
        _child(REDIS_REFUSALS, (kind,))
    for task_type in types:
        for reason in DEAD_REASONS:
            _child(DEAD, (task_type, reason))


#: A ``misfired`` line's policy -> the reason its missed grid times were not run.
_MISFIRE_REASON = {"coalesce": "coalesced", "skip": "misfire_skip", "fire_all": "misfire_cap"}
#: The reasons ``metronome_fires_not_run_total`` keeps; any other counts as ``other``, so a
#: line from a newer version cannot grow the label set.
NOT_RUN_REASONS = frozenset(
    {"overlap", "expired", "stopped", "updated", "paused", *_MISFIRE_REASON.values(), "other"}
)


def _not_run_reason(reason: Any) -> str:
    return reason if reason in NOT_RUN_REASONS else "other"


class _Gathered:
    """Counts and observations not written yet, while a ``MetricsWriter`` runs in this
    process (``gathering``); else each batch is written at once. A lock, since a line may
    be logged from a thread (an I/O thread's ``redis_refused``)."""

    def __init__(self) -> None:
        self.gathering = False
        self.lock = threading.Lock()
        self.tally: Tally[tuple[Any, ...]] = Tally()
        self.observed: dict[tuple[Histogram, str], list[float]] = {}

    def take(self) -> tuple[Tally[tuple[Any, ...]], dict[tuple[Histogram, str], list[float]]]:
        with self.lock:
            taken = self.tally, self.observed
            self.tally, self.observed = Tally(), {}
        return taken


_gathered = _Gathered()


def gather_writes(on: bool) -> None:
    """From now on, gather counts until ``write_gathered`` (on), or write each batch at once
    (off; what was gathered is written first). ``MetricsWriter`` turns it on while it runs."""
    with _gathered.lock:
        _gathered.gathering = on
    write_gathered()


def write_gathered() -> None:
    """Write what ``count_events`` gathered since the last write."""
    _write(*_gathered.take())


def count_events(actor: str, events: Events) -> None:
    """Turn one batch of logged events into samples. Counts and histogram observations
    are summed per label set, then written once per batch, or about every
    ``metrics_writer.WRITE_EVERY_S`` where a ``MetricsWriter`` runs: in multiprocess mode
    each write is a locked write to a memory-mapped file, and a node with many types makes
    small batches of each (docs/PERFORMANCE.md, "Metric writes")."""
    if _gathered.gathering:
        with _gathered.lock:
            if _gathered.gathering:
                _tally_events(actor, events, _gathered.tally, _gathered.observed)
                return
    tally: Tally[tuple[Any, ...]] = Tally()
    observed: dict[tuple[Histogram, str], list[float]] = {}
    _tally_events(actor, events, tally, observed)
    _write(tally, observed)


def _tally_events(
    actor: str, events: Events, tally: Tally[tuple[Any, ...]],
    observed: dict[tuple[Histogram, str], list[float]],
) -> None:  # fmt: skip
    for event, fields in events:
        kind = fields.get("type", "")
        if event == "runs_finished":  # a batch's successes (their `finished` lines are text)
            durations = fields.get("durations_ms", [])
            tally[(FINISHED, kind, "ok")] += len(durations)
            observed.setdefault((DURATION, kind), []).extend(
                took / 1000 if took > 0 else 0.0 for took in durations
            )
        elif event == "queued":
            tally[(ENQUEUED, kind, "first" if not fields.get("attempt") else "retry")] += 1
        elif event == "fires_queued":  # a batch's summary when its `queued` lines are not built
            for attempt in ("first", "retry"):
                if fields.get(attempt):
                    tally[(ENQUEUED, kind, attempt)] += fields[attempt]
        elif event == "running":
            tally[(STARTED, kind)] += 1
            lag = max(0, fields.get("start_lag_ms", 0)) / 1000
            observed.setdefault((START_LAG, kind), []).append(lag)
        elif event == "runs_started":  # a batch's summary when its `running` lines are not built
            lags = fields.get("start_lags_ms", [])
            tally[(STARTED, kind)] += len(lags)
            observed.setdefault((START_LAG, kind), []).extend(max(0, x) / 1000 for x in lags)
        elif event == "retried" or (event == "dead" and "duration_ms" in fields):
            outcome = "retried" if event == "retried" else "dead"
            tally[(FINISHED, kind, outcome)] += 1
            took = max(0, fields.get("duration_ms", 0)) / 1000
            observed.setdefault((DURATION, kind), []).append(took)
            if str(fields.get("error", "")).startswith("timeout:"):
                tally[(TIMEOUTS, kind)] += 1
            if event == "retried":
                tally[(RETRIES, kind)] += 1
            elif event == "dead":
                tally[(DEAD, kind, fields.get("reason", "failed"))] += 1
        elif event == "cancelled":  # a cancel_other fire replaced the run it ended
            tally[(FINISHED, kind, "cancelled")] += 1
            took = max(0, fields.get("duration_ms", 0)) / 1000
            observed.setdefault((DURATION, kind), []).append(took)
        elif event == "dead":  # poison or malformed: no handler ran this time
            tally[(DEAD, kind, fields.get("reason", "poison"))] += 1
        elif event == "misfired":
            policy = str(fields.get("policy", ""))
            tally[(MISFIRES, kind, policy)] += 1
            missed = int(fields.get("missed", 0))  # grid times not fired one by one
            if missed > 0:
                tally[(NOT_RUN, kind, _not_run_reason(_MISFIRE_REASON.get(policy)))] += missed
        elif event == "not_run":  # one fire not run (overlap, expired, stopped, updated),
            count = fields.get("count", 1)  # or the many a pause skipped (paused)
            n = count if type(count) is int and count > 0 else 1
            tally[(NOT_RUN, kind, _not_run_reason(fields.get("reason")))] += n
        elif event == "duplicate_dropped":
            tally[(DUPLICATES, kind)] += 1
        elif event == "reclaimed":
            tally[(RECLAIMS, kind)] += 1
        elif event == "redis_refused":
            tally[(REDIS_REFUSALS, str(fields.get("kind", "")))] += 1
        elif event in (
            "fires_held_back", "retries_held_back", "completions_held_back", "cancels_not_sent",
            "malformed_held",
        ):  # fmt: skip
            tally[(REDIS_REFUSALS, "rejected")] += 1
        elif event == "actor_restarting":
            tally[(RESTARTS, actor)] += 1
        elif event == "actor_gave_up":
            tally[(GIVE_UPS, f"{actor}/{fields.get('child', '?')}")] += 1


def _write(
    tally: Tally[tuple[Any, ...]], observed: dict[tuple[Histogram, str], list[float]]
) -> None:
    for (metric, *labels), n in tally.items():
        _child(metric, tuple(labels)).inc(n)
    for (histogram, kind), values in observed.items():
        _observe_many(_child(histogram, (kind,)), values)


_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def _child(metric: Any, labels: tuple[str, ...]) -> Any:
    """``metric.labels(*labels)``, remembered (the lookup takes a lock and builds a key)."""
    key = (metric, labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def _observe_many(child: Any, values: list[float]) -> None:
    """``child.observe(v)`` for each value, written as one increment per bucket and one
    to the sum. prometheus-client has no bulk observe; this uses its histogram's layout
    (non-cumulative buckets by upper bound, a sum), and falls back to ``observe``."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in values:
            child.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    total.inc(sum(values))


def install() -> None:
    """Count this process's events from now on (idempotent)."""
    observe_events(count_events)
