"""Notes on paused and resumed tasks, in process against a real Redis: what the status
script stores with a change, what removes it, and how explain reads what it finds in the
notes hash (the operator's notes and the automatic pause's), Redis itself the judge."""

from __future__ import annotations

import json

import pytest

from actors.api.explain import explain
from actors.domain.errors import InvalidTask
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.notes import MAX_NOTE_CHARS
from actors.store.tasks import TaskStore
from runtime.logging import Events, observe_events, stop_observing
from runtime.redis_io import RedisClient


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace)


async def _stored_note(store: TaskStore, task_id: str) -> dict[str, object] | None:
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.notes(keys.partition_of(task_id)), task_id)
    return None if raw is None else json.loads(raw)


async def _task(store: TaskStore, task_id: str) -> None:
    later = Schedule("interval", every_s=60, start_ms=await store.now_ms() + 600_000)
    await store.create(TaskSpec("t", later, task_id=task_id))


async def test_a_note_is_kept_with_the_change_and_replaced_by_the_next(store: TaskStore) -> None:
    await _task(store, "n")
    before = await store.now_ms()
    assert await store.pause("n", "db move until 14:00", by="ops") == "paused"
    note = await _stored_note(store, "n")
    assert note is not None and set(note) == {"note", "action", "at_ms", "by"}
    assert (note["note"], note["action"], note["by"]) == ("db move until 14:00", "pause", "ops")
    assert isinstance(note["at_ms"], int) and note["at_ms"] >= before - 1000

    # Pausing a paused task changes nothing: the note stays the one of the real change.
    assert await store.pause("n", "another reason") == "paused"
    assert (await _stored_note(store, "n") or {})["note"] == "db move until 14:00"

    # A change with a note replaces it (no key: no `by`); one without removes it.
    assert await store.resume("n", "migration done") == "active"
    note = await _stored_note(store, "n")
    assert note is not None and set(note) == {"note", "action", "at_ms"}
    assert (note["note"], note["action"]) == ("migration done", "resume")
    assert await store.pause("n") == "paused"
    assert await _stored_note(store, "n") is None


async def test_the_paused_line_carries_the_note(store: TaskStore) -> None:
    await _task(store, "logged")
    seen: list[tuple[str, dict[str, object]]] = []

    def observe(_actor: str, events: Events) -> None:
        seen.extend((event, dict(fields)) for event, fields in events)

    observe_events(observe)
    try:
        await store.pause("logged", "quiet hours")
        await store.resume("logged")
    finally:
        stop_observing(observe)
    lines = [(e, f) for e, f in seen if f.get("task_id") == "logged"]
    assert lines == [
        ("paused", {"task_id": "logged", "status": "paused", "note": "quiet hours"}),
        ("resumed", {"task_id": "logged", "status": "active"}),
    ]


async def test_deleting_a_task_deletes_its_note(store: TaskStore) -> None:
    await _task(store, "gone")
    await store.pause("gone", "why not")
    assert await store.delete("gone")
    assert await _stored_note(store, "gone") is None


async def test_a_refused_note_writes_nothing(store: TaskStore) -> None:
    await _task(store, "r")
    for bad in ("", "   ", "x" * (MAX_NOTE_CHARS + 1), "bell\x07"):
        with pytest.raises(InvalidTask, match="note"):
            await store.pause("r", bad)
    assert (await store.get("r")).status == "active"  # type: ignore[union-attr]
    assert await _stored_note(store, "r") is None
    assert await store.pause("r", "x" * MAX_NOTE_CHARS) == "paused"


async def test_explain_shows_the_note_and_the_automatic_pauses(store: TaskStore) -> None:
    await _task(store, "e")
    await store.pause("e", "waiting for the vendor", by="ops")
    facts = await explain(store, "e")
    assert facts["note"]["note"] == "waiting for the vendor" and facts["note"]["by"] == "ops"
    assert facts["summary"][0].startswith("paused")
    assert facts["summary"][1].startswith("paused at ") and facts["summary"][1].endswith(
        " by key ops: waiting for the vendor"
    )

    # What the consumer's outcome script writes when a streak of dead fires pauses a task.
    keys = await store.keys()
    notes = keys.notes(keys.partition_of("e"))
    auto = {"note": "ValueError: the vendor said no", "action": "pause", "reason": "failures",
            "failures": 3, "at_ms": 1796299200000}  # fmt: skip
    await store.client.execute("HSET", notes, "e", json.dumps(auto))
    facts = await explain(store, "e")
    assert facts["note"] == auto
    assert facts["summary"][1] == (
        "paused after 3 dead fires in a row at 2026-12-03T12:00:00Z: ValueError: the vendor said no"
    )

    await store.client.execute("HSET", notes, "e", "not json {")
    facts = await explain(store, "e")
    assert facts["note"] == {"unreadable": "not json {"}
    assert "cannot be read" in facts["summary"][1]
