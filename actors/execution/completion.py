"""What to do with a batch of finished handler runs: a pure function, no Redis.

``decide`` splits a batch into successes (results log, ACK), failures to retry (a retry
context at finish + backoff, then ACK) and failures that are done (dead letter, which ACKs
in the same script), and says what every task's last outcome is and which lifecycle lines
to write. The consumer's completing part (``actors.execution.consumer``) then writes it
through ``Scripts.complete`` in the order that keeps the ACK invariant.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from actors.store.flights import (
    ENDED_CANCELLED,
    ENDED_DEAD,
    ENDED_EXPIRED,
    ENDED_OK,
    TRACKED_LETTERS,
    FlightEnd,
    origin_and_allowance,
    parse_policy,
)
from actors.store.messages import Message
from actors.store.queue_rows import short_error_line
from actors.store.replies import DeadLetterWrite, OutcomeWrite, RetryWrite
from runtime.logging import FixedFields

#: Longest error text kept (DLQ entry, retry context, the task's last error).
MAX_ERROR_CHARS = 2000


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class Outcome:
    """One handler run, finished."""

    message: Message
    started_ms: int
    finished_ms: int
    result: Any = None
    error: str | None = None
    """None on success."""
    retry_after_s: float | None = None
    """Set by RetryLater."""
    unrecoverable: bool = False
    not_run: str | None = None
    """``cancelled`` (a ``cancel_other`` fire replaced it while it ran) or ``expired``
    (later than its catch-up window when it would have started): acknowledged, never
    retried."""


@attrs.frozen
class RetryPolicy:
    max_attempts: int = 3
    backoff_base_s: float = 10.0
    backoff_cap_s: float = 300.0
    backoff_jitter: float = 0.1

    def backoff_s(self, failed_attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Delay before retry n (n = the 1-based number of the attempt that failed)."""
        base = min(self.backoff_cap_s, self.backoff_base_s * 2.0 ** min(failed_attempt - 1, 60))
        return base * (1 + draw() * self.backoff_jitter)


@attrs.frozen
class Completion:
    """What a batch of outcomes turns into (``decide``)."""

    results: list[Any]
    """The handlers' results of the successes, in the order of ``finished``: each
    results-log line is that success's ``finished`` line fields (``bodies``) and its
    ``result`` (``actors.execution.results_log.result_line``), written before anything is
    acknowledged."""
    retries: list[RetryWrite]
    outcomes: list[OutcomeWrite]
    dead: list[DeadLetterWrite]
    acks: list[str]
    """Message ids acknowledged plainly (dead letters are acknowledged by their script)."""
    finished: list[tuple[Any, ...]]
    """Each success's ``LIFECYCLE`` values: its ``finished`` line."""
    bodies: list[str]
    """``finished`` encoded (``LIFECYCLE.encode_many``): the ``finished`` log lines and
    the results-log lines share them."""
    events: list[tuple[str, dict[str, Any]]]
    """The other lifecycle lines: ``retried``, ``dead``, ``cancelled``, ``not_run`` (a few)."""
    flights: list[FlightEnd] = attrs.field(factory=list)
    """Fires of tasks with a policy that ended (``actors.store.flights``)."""
    cancels_done: list[str] = attrs.field(factory=list)
    """The schedule ids of the ended tracked fires (a task with an overlap policy:
    ``TRACKED_LETTERS``, which a ``cancel_other`` fire may replace): a cancel request for
    one that it ended before (``cancel_fires.lua``) goes with the ACKs, else the request
    would stay in a busy type's cancel hash for good."""

    @property
    def durations_ms(self) -> list[int]:
        """Each success's run time (its ``finished`` line's ``duration_ms``), for the
        observers' ``runs_finished`` summary."""
        return [v[_DURATION] for v in self.finished]

    def finished_fields(self) -> list[dict[str, Any]]:
        """The ``finished`` lines' fields as dicts (console logs only)."""
        return [LIFECYCLE.fields(v) for v in self.finished]


def describe_error(exc: BaseException) -> str:
    """The exception and a short traceback (the last frames), bounded in size. A lone
    surrogate (bytes decoded with ``surrogateescape``) is escaped: UTF-8 cannot encode
    it, and the text goes to Redis and the logs."""
    text = "".join(traceback.format_exception(exc, limit=-3))[-MAX_ERROR_CHARS:]
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


#: The fields every lifecycle line of a fire carries, in order (``fire_fields``).
FIRE_KEYS = ("task_id", "schedule_id", "type", "attempt", "msg_id")


def fire_fields(m: Message, **more: Any) -> dict[str, Any]:
    """The fields every lifecycle line of a fire carries (``FIRE_KEYS``), and ``more``
    (merged here rather than into a copy of this dict by each caller)."""
    return {
        "task_id": m.task_id,
        "schedule_id": m.schedule_id,
        "type": m.type,
        "attempt": m.attempt,
        "msg_id": m.msg_id,
        **more,
    }


#: A finished run's line, field by field: the fire's fields (``fire_fields``) and every time
#: of its life, so that one line reads as the seed's Scheduled (``due_ms``) → Queued
#: (``queued_ms``) → Running (``started_ms``) → Finished/Retried (``finished_ms``).
LIFECYCLE = FixedFields(
    (*FIRE_KEYS, "due_ms", "queued_ms", "started_ms", "finished_ms", "start_lag_ms",
     "duration_ms"),
    text=("task_id", "schedule_id", "type", "msg_id"),
)  # fmt: skip
_DURATION = LIFECYCLE.keys.index("duration_ms")


def lifecycle_values(o: Outcome) -> tuple[Any, ...]:
    """A finished run's ``LIFECYCLE`` values."""
    m = o.message
    started, finished = o.started_ms, o.finished_ms
    return (
        m.task_id, m.schedule_id, m.type, m.attempt, m.msg_id, m.due_ms, m.enq_ms,
        started, finished, started - m.due_ms, finished - started,
    )  # fmt: skip


def lifecycle(o: Outcome) -> dict[str, Any]:
    """A finished run's line fields (``LIFECYCLE``)."""
    return LIFECYCLE.fields(lifecycle_values(o))


def decide(
    batch: Sequence[Outcome],
    policy: RetryPolicy,
    node: str,
    draw: Callable[[], float] = random.random,
) -> Completion:
    """Split a batch into results, retries, dead letters and ACKs (see the module)."""
    ok = [o for o in batch if o.error is None and o.not_run is None]
    failed = [o for o in batch if o.error is not None and o.not_run is None]
    not_run = [o for o in batch if o.not_run is not None]
    retry: list[Outcome] = []
    dead: list[Outcome] = []
    for o in failed:  # one pass: a membership test per outcome would be quadratic
        is_retried = not o.unrecoverable and o.message.attempt + 1 < policy.max_attempts
        (retry if is_retried else dead).append(o)
    delays = {
        o.message.msg_id: (
            max(0.0, o.retry_after_s)
            if o.retry_after_s is not None
            else policy.backoff_s(o.message.attempt + 1, draw)
        )
        for o in retry
    }
    coded = [(o, code) for code, group in ((0, ok), (1, retry), (2, dead), (3, not_run))
             for o in group]  # fmt: skip
    # in the order the runs finished (the same millisecond: the later due time last): of
    # a task's several outcomes in one batch, the last written is its last status and its
    # newest history entry
    coded.sort(key=lambda pair: (pair[0].finished_ms, pair[0].message.due_ms))
    outcomes = [_outcome(o, code) for o, code in coded]
    finished = [lifecycle_values(o) for o in ok]
    policies = any(o.message.policy for o in batch)
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "retried",
            {
                **lifecycle(o),
                "next_attempt": o.message.attempt + 1,
                "delay_s": round(delays[o.message.msg_id], 3),
                "error": short_error_line(o.error),
            },
        )
        for o in retry
    ]
    events += [
        (
            "dead",
            {
                **lifecycle(o),
                "attempts": o.message.attempt + 1,
                "reason": _reason(o),
                "error": short_error_line(o.error),
            },
        )
        for o in dead
    ]
    events += [_not_run_line(o) for o in not_run]
    return Completion(
        results=[o.result for o in ok],
        retries=[
            RetryWrite(o.message, int(delays[o.message.msg_id] * 1000), o.error or "")
            for o in retry
        ],
        outcomes=outcomes,
        dead=[_dead_letter(o, node) for o in dead],
        acks=[o.message.msg_id for o in ok + retry + not_run],
        finished=finished,
        bodies=LIFECYCLE.encode_many(finished),
        events=events,
        flights=_flight_ends(batch, retry) if policies else [],
        cancels_done=[
            o.message.schedule_id
            for o in ok + dead + not_run
            if o.message.policy[:1] in TRACKED_LETTERS
        ]
        if policies
        else [],
    )


#: ``OutcomeWrite.outcome`` of a fire not run, by reason.
_NOT_RUN_CODES = {"cancelled": 3, "expired": 4}


def _outcome(o: Outcome, code: int) -> OutcomeWrite:
    """A fire's outcome for its task's run record and history (code 3: not run, by its
    reason). A fire that did not start (expired) has no start time."""
    m = o.message
    if code == 3:
        code = _NOT_RUN_CODES.get(o.not_run or "", 3)
    error = o.error
    origin, allowed = origin_and_allowance(m.policy) if m.policy else (0, 0)
    return OutcomeWrite(
        m.task_id,
        code,
        o.finished_ms,
        (error or "")[:MAX_ERROR_CHARS],
        m.due_ms,
        None if code == 4 else o.started_ms,
        m.attempt,
        origin,
        short_error_line(error)[:_HISTORY_LINE] if error else "",
        allowed if origin == 0 and m.attempt == 0 else None,
    )


#: The longest error line a history entry keeps.
_HISTORY_LINE = 200


def _not_run_line(o: Outcome) -> tuple[str, dict[str, Any]]:
    if o.not_run == "cancelled":
        return ("cancelled", {**lifecycle(o), "reason": "overlap"})
    return ("not_run", fire_fields(o.message, due_ms=o.message.due_ms, reason=o.not_run))


_ENDED = {None: ENDED_OK, "cancelled": ENDED_CANCELLED, "expired": ENDED_EXPIRED}


def _flight_ends(batch: Sequence[Outcome], retry: Sequence[Outcome]) -> list[FlightEnd]:
    """The ends of fires whose task has a policy: every outcome but a retry (a fire
    waiting for its retry is still in flight)."""
    retried = {id(o) for o in retry}
    ends = []
    for o in batch:
        policy = parse_policy(o.message.policy) if o.message.policy else None
        if policy is None or id(o) in retried:
            continue
        if not policy.tracked and policy.pause_after is None and o.not_run != "expired":
            continue  # nothing to end (an expired fire is noted on its task: explain)
        ended = ENDED_DEAD if o.error is not None and o.not_run is None else _ENDED[o.not_run]
        ends.append(
            FlightEnd(o.message.task_id, ended, o.message.due_ms, policy.pause_after,
                      short_error_line(o.error), policy.born)
        )  # fmt: skip
    return ends


def _reason(o: Outcome) -> str:
    return "unrecoverable" if o.unrecoverable else "failed"


def _dead_letter(o: Outcome, node: str) -> DeadLetterWrite:
    m = o.message
    return DeadLetterWrite(
        m.msg_id,
        {
            **m.fields(),
            "attempts": str(m.attempt + 1),
            "reason": _reason(o),
            "error": o.error or "",
            "node": node,
            "dead_ms": str(o.finished_ms),
            "msg_id": m.msg_id,
        },
    )
