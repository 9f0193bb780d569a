"""How ``metronome queues`` reads a type's raw stream facts: numbers an operator can trust
even when Redis's own counters are stale (entries deleted after they were acknowledged)."""

from __future__ import annotations

from typing import Any

from actors.api.queues import _dead_letter
from actors.store.history import _error_lines
from actors.store.keys import CONSUMER_GONE_MS, GROUP
from actors.store.ledger import _error_line, parse_entry
from actors.store.queue_rows import error_line, queue_row
from tests.error_texts import EXAMPLES

NOW = 1_800_000_000_000


def row(
    length: int, lag: int | None, pending: int, oldest_ms: int | None, consumers: list[Any]
) -> list[Any]:
    group = {"name": GROUP.encode(), "lag": lag}
    summary = {"pending": pending, "min": f"{oldest_ms}-0".encode() if oldest_ms else None}
    return [length, 0, [group], consumers, summary]


def test_undelivered_never_exceeds_what_the_stream_holds() -> None:
    # Seen after a node was killed: lag 6253 with an empty stream.
    assert queue_row("t", row(0, 6253, 0, None, []), NOW, {})["undelivered"] == 0
    assert queue_row("t", row(10, 4, 6, NOW - 5, []), NOW, {})["undelivered"] == 4
    # Lag unknown (entries deleted mid-stream): what is not pending is undelivered.
    assert queue_row("t", row(10, None, 6, NOW - 5, []), NOW, {})["undelivered"] == 4
    # No group yet: nothing was ever delivered.
    no_group = [7, 0, [], [], {"pending": 0}]
    assert queue_row("t", no_group, NOW, {})["undelivered"] == 7


def test_oldest_pending_age_is_never_negative() -> None:
    ahead = queue_row("t", row(1, 0, 1, NOW + 3, []), NOW, {})
    assert ahead["oldest_pending_age_ms"] == 0


def test_consumers_gone_quiet_with_nothing_pending_are_left_out() -> None:
    consumers = [
        {"name": b"live", "pending": 0, "idle": 200},
        {"name": b"gone", "pending": 0, "idle": CONSUMER_GONE_MS + 1},
        {"name": b"dead-holding", "pending": 3, "idle": CONSUMER_GONE_MS * 10},
    ]
    shown = queue_row("t", row(3, 0, 3, NOW - 1, consumers), NOW, {})["consumers"]
    assert [c["name"] for c in shown] == ["live", "dead-holding"]


def test_error_line_is_the_exception_line_of_a_traceback() -> None:
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: boom\n\n'
    assert error_line(traceback) == "RuntimeError: boom"
    assert (
        error_line("timeout: handler ran longer than 3s") == "timeout: handler ran longer than 3s"
    )
    assert error_line("first\nlast\n") == "last"
    assert error_line(" \n  \n") == ""
    assert error_line(None) is None


def test_error_line_is_the_exception_line_whatever_follows_it() -> None:
    """A message of several lines, a note or a cause puts other lines after the
    exception's, or before it: the line shown (log lines, history, DLQ lists, explain) is
    still the exception's."""
    assert "connection reset" in EXAMPLES[2][0]
    lines = [line for _, line in EXAMPLES]
    assert [error_line(text) for text, _ in EXAMPLES] == lines
    assert [_error_line(text.encode()) for text, _ in EXAMPLES] == lines  # attention's
    stored = "".join(f"{due} 0 {line}\n" for due, line in enumerate(lines))  # history's
    assert _error_lines(stored.encode()) == {(due, 0): line for due, line in enumerate(lines)}


def test_numbers_another_program_wrote_read_as_absent_not_as_a_crash() -> None:
    """An attention entry, an error line of a task's history and a dead letter's time
    hold numbers as text; one that is not a number Metronome writes (two signs, more
    digits than ``int`` reads, another script's digits) is left out, or its entry's own
    time used, never a ValueError that fails every page holding it with a 500."""
    huge = "9" * 5000
    assert parse_entry("x", b"dead 1 --5 email") is None
    assert parse_entry("x", f"dead {huge} 5 email".encode()) is None
    assert parse_entry("x", "dead ٣ 5 email".encode()) is None
    entry = parse_entry("x", b"dead 1 -5 email")
    assert entry is not None and (entry.since_ms, entry.due_ms, entry.type) == (1, -5, "email")
    assert _error_lines(f"{huge} 1 boom\n12 1 ok".encode()) == {(12, 1): "ok"}
    assert _dead_letter(b"1700000000000-0", [b"dead_ms", huge.encode()]).dead_ms == 1700000000000
