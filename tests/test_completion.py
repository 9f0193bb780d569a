"""The consumer's completion decision, as a pure function: no Redis, no trio."""

from __future__ import annotations

import json

import attrs

from actors.execution.completion import MAX_ERROR_CHARS, Outcome, RetryPolicy, decide
from actors.execution.results_log import result_line
from actors.store.messages import Message
from actors.store.records import OUTCOME_NAMES
from runtime.logging import encode_fields
from tests.error_texts import EXAMPLES


def message(task_id: str, attempt: int = 0, msg_id: str | None = None) -> Message:
    return Message(
        msg_id or f"1-{task_id}", task_id, f"{task_id}:100", "t", '{"a":1}', attempt, 100, 100,
        payload={"a": 1},
    )  # fmt: skip


POLICY = RetryPolicy(max_attempts=3, backoff_base_s=10, backoff_cap_s=300, backoff_jitter=0.5)


def test_success_is_a_result_line_an_outcome_and_an_ack() -> None:
    plan = decide([Outcome(message("a"), 1000, 1250, result={"ok": True})], POLICY, "n1")
    assert plan.results == [{"ok": True}] and plan.events == []
    (fields,) = plan.finished_fields()
    assert plan.bodies == [encode_fields(fields)]
    line = json.loads(result_line(plan.bodies[0], plan.results[0]))
    assert line == {
        "task_id": "a", "schedule_id": "a:100", "type": "t", "attempt": 0, "msg_id": "1-a",
        "due_ms": 100, "queued_ms": 100, "started_ms": 1000, "finished_ms": 1250,
        "start_lag_ms": 900, "duration_ms": 250, "result": {"ok": True},
    }  # fmt: skip
    assert plan.acks == ["1-a"] and plan.retries == [] and plan.dead == []
    assert [(o.task_id, OUTCOME_NAMES[o.outcome], o.error) for o in plan.outcomes] == [
        ("a", "ok", "")
    ]
    assert plan.durations_ms == [250] and fields["duration_ms"] == 250


def test_a_failure_below_max_attempts_is_retried_after_the_backoff_then_acked() -> None:
    failed = Outcome(message("a", attempt=1), 1000, 2000, error="Traceback...\nValueError: x")
    plan = decide([failed], POLICY, "n1", draw=lambda: 0.5)
    (retry,) = plan.retries
    # attempt 1 failed: retry 2 waits base * 2 = 20 s, stretched by 0.5 * 0.5 jitter
    assert retry.delay_ms == 25_000 and retry.message.attempt == 1
    assert plan.acks == ["1-a"] and plan.results == [] and plan.dead == []
    ((name, event),) = plan.events
    assert (name, event["next_attempt"], event["delay_s"], event["error"]) == (
        "retried", 2, 25.0, "ValueError: x",
    )  # fmt: skip


def test_a_failures_line_is_its_exceptions_whatever_follows_in_its_text() -> None:
    """The ``retried`` and ``dead`` lines and the history entry name a failure by its
    exception's line, not by a note or a message's last line after it."""
    (text, line), (other, other_line) = EXAMPLES[1], EXAMPLES[0]
    retried = Outcome(message("a"), 1000, 2000, error=text)
    dead = Outcome(message("b"), 1000, 2000, error=other, unrecoverable=True)
    plan = decide([retried, dead], POLICY, "n1")
    assert [(name, event["error"]) for name, event in plan.events] == [
        ("retried", line), ("dead", other_line),
    ]  # fmt: skip
    assert sorted((o.line, o.error) for o in plan.outcomes) == sorted(
        [(line, text), (other_line, other)]
    )


def test_a_tasks_outcomes_in_one_batch_are_written_in_the_order_they_finished() -> None:
    """An older fire that failed and a newer one that ran, in one batch: the run record
    and history are written failure first, so the task's last status is the success."""
    failed = Outcome(message("a", msg_id="1-a"), 1000, 1500, error="ValueError: x")
    ran = Outcome(message("a", msg_id="2-a"), 1600, 2000)
    dead = Outcome(message("a", msg_id="3-a", attempt=2), 900, 1200, error="boom")
    plan = decide([ran, failed, dead], POLICY, "n1")
    assert [(OUTCOME_NAMES[o.outcome], o.finished_ms) for o in plan.outcomes] == [
        ("dead", 1200), ("retry", 1500), ("ok", 2000),
    ]  # fmt: skip
    # the same millisecond: the later due time last
    newer = attrs.evolve(message("a", msg_id="4-a"), due_ms=200)
    at_once = [Outcome(newer, 1600, 2000), attrs.evolve(failed, finished_ms=2000)]
    assert [OUTCOME_NAMES[o.outcome] for o in decide(at_once, POLICY, "n1").outcomes] == [
        "retry", "ok",
    ]  # fmt: skip


def test_retry_later_sets_its_own_delay() -> None:
    later = Outcome(message("a"), 1000, 1000, error="RetryLater", retry_after_s=3)
    assert decide([later], POLICY, "n1").retries[0].delay_ms == 3000


def test_the_last_attempt_and_unrecoverable_failures_are_dead_letters_not_acks() -> None:
    last = Outcome(message("a", attempt=2), 1000, 1500, error="boom")
    fatal = Outcome(message("b"), 1000, 1500, error="bad", unrecoverable=True)
    plan = decide([last, fatal], POLICY, "node-7")
    assert plan.acks == [] and plan.retries == []  # dead_letter.lua acknowledges them
    by_id = {d.msg_id: d.fields for d in plan.dead}
    assert by_id["1-a"]["reason"] == "failed" and by_id["1-a"]["attempts"] == "3"
    assert by_id["1-b"]["reason"] == "unrecoverable" and by_id["1-b"]["node"] == "node-7"
    assert by_id["1-a"]["schedule_id"] == "a:100" and by_id["1-a"]["dead_ms"] == "1500"
    assert {OUTCOME_NAMES[o.outcome] for o in plan.outcomes} == {"dead"}


def test_errors_are_bounded_in_the_stored_outcome() -> None:
    huge = Outcome(message("a"), 0, 1, error="x" * (MAX_ERROR_CHARS * 3))
    (outcome,) = decide([huge], POLICY, "n1").outcomes
    assert len(outcome.error) == MAX_ERROR_CHARS


def test_backoff_is_capped_and_never_overflows() -> None:
    policy = RetryPolicy(backoff_base_s=10, backoff_cap_s=300, backoff_jitter=0)
    assert policy.backoff_s(10_000) == 300


def test_a_finished_line_with_names_to_escape_is_encoded_as_any_line_is() -> None:
    """The finished line's fast encoding (one format call) applies to plain names only; a
    task id, type or message id that needs JSON escaping (a message written by hand) is
    encoded as every other line, and both read back as the fields."""
    for task_id, kind in [("plain-1", "t"), ('a"b\\c', "t"), ("ü\n", 'ty"pe')]:
        m = Message(
            "1-x", task_id, f"{task_id}:100", kind, "{}", 0, 100, 100, payload={},
        )  # fmt: skip
        plan = decide([Outcome(m, 1000, 1250, result=None)], POLICY, "n1")
        (fields,) = plan.finished_fields()
        assert plan.bodies == [encode_fields(fields)]
        assert json.loads("{" + plan.bodies[0][1:] + "}") == fields
        assert (fields["task_id"], fields["type"]) == (task_id, kind)


def test_a_batch_with_one_name_to_escape_encodes_every_line_right() -> None:
    """A batch's names are checked at once (``FixedFields.encode_many``): one that needs
    escaping, or a ``%`` the fast format would read as its own, sends the batch the
    careful way, and every line still reads back as its fields."""
    ids = ["plain-1", 'a"b', "50%s off", "plain-2"]
    batch = [
        Outcome(Message(f"1-{i}", t, f"{t}:100", "t", "{}", 0, 100, 100, payload={}), 1000, 1250)
        for i, t in enumerate(ids)
    ]
    plan = decide(batch, POLICY, "n1")
    lines = [json.loads("{" + body[1:] + "}") for body in plan.bodies]
    assert lines == plan.finished_fields()
    assert [line["task_id"] for line in lines] == ids
