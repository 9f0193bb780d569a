"""The fast lifecycle-line paths of ``runtime.logging``: what they write, in either format,
and what observers get."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from actors.execution.completion import LIFECYCLE
from runtime import logging as node_logging
from runtime.logging import Events, emit_encoded, observe_events, stop_observing

ROWS = [
    ("t1", "t1:100", "work", 0, "1-0", 100, 101, 120, 125, 20, 5),
    ("t2", "t2:100", "work", 1, "1-1", 100, 101, 130, 160, 30, 30),
]


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    yield buffer
    node_logging.configure(node="test")


def emit_batch(seen: list[tuple[str, Events]]) -> None:
    def observer(actor: str, events: Events) -> None:
        seen.append((actor, list(events)))

    observe_events(observer)
    try:
        emit_encoded(
            "node/c", "finished", LIFECYCLE.encode_many(ROWS),
            ("runs_finished", {"type": "work", "durations_ms": [5, 30]}),
            lambda: [LIFECYCLE.fields(row) for row in ROWS],
        )  # fmt: skip
    finally:
        stop_observing(observer)


def test_encoded_lines_read_as_the_fields_with_the_lines_tail(output: io.StringIO) -> None:
    node_logging.configure(node="n1", stream=output)
    seen: list[tuple[str, Events]] = []
    emit_batch(seen)
    lines: list[dict[str, Any]] = [json.loads(line) for line in output.getvalue().splitlines()]
    assert [
        {k: v for k, v in line.items() if k not in ("time", "ts_ms")} for line in lines
    ] == [
        {"event": "finished", **LIFECYCLE.fields(row), "node": "n1", "actor": "node/c",
         "level": "info"}
        for row in ROWS
    ]  # fmt: skip
    assert all(isinstance(line["ts_ms"], int) and line["time"].endswith("Z") for line in lines)
    # Observers get the batch's summary, not a dict a line.
    assert seen == [("node/c", [("runs_finished", {"type": "work", "durations_ms": [5, 30]})])]


def test_encoded_lines_in_console_format_are_rendered_from_their_fields(
    output: io.StringIO,
) -> None:
    node_logging.configure(node="n1", stream=output, format="console")
    seen: list[tuple[str, Events]] = []
    emit_batch(seen)
    text = output.getvalue().splitlines()
    assert len(text) == 2 and not text[0].lstrip().startswith("{")
    assert all("finished" in line for line in text)
    assert "task_id=t1" in text[0] and "duration_ms=30" in text[1]
    assert [events for _, events in seen] == [
        [("runs_finished", {"type": "work", "durations_ms": [5, 30]})]
    ]


def test_a_warning_is_observed_at_level_error_and_not_written(output: io.StringIO) -> None:
    """Metrics count every step at any level: a warning (an actor restarting, a refusal)
    logged at ``level = "error"`` reaches the observers, and only the error is written
    (the filter dropped the warning before any observer saw it)."""
    node_logging.configure(node="n1", stream=output, level="error")
    seen: list[tuple[str, Events]] = []

    def observer(actor: str, events: Events) -> None:
        seen.append((actor, list(events)))

    observe_events(observer)
    try:
        log = node_logging.get_logger(actor="node/x")
        log.warning("actor_restarting", attempt=1)
        log.error("actor_crashed")
        log.debug("never_built")
    finally:
        stop_observing(observer)
    assert [events[0][0] for _, events in seen] == ["actor_restarting", "actor_crashed"]
    (line,) = output.getvalue().splitlines()
    assert json.loads(line)["event"] == "actor_crashed"


def test_no_line_is_written_below_its_level(output: io.StringIO) -> None:
    node_logging.configure(node="n1", stream=output, level="warning")
    seen: list[tuple[str, Events]] = []
    emit_batch(seen)
    assert output.getvalue() == ""
    assert len(seen) == 1  # metrics count what ran whatever the log level
