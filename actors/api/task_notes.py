"""A task's note and not-run record as the API reads and shows them.

Pause and resume take an optional body ``{"note": "..."}``: an empty body (what every
client sent before notes existed) or one without ``note`` changes the status alone. The
note is kept with the change by the store (``actors.store.notes`` says what it holds);
``GET /v1/tasks/{id}`` answers it under ``note``, and ``explain`` shows it and the task's
not-run record (fires that were due and not run, and why) as facts and sentences. A
stored value these readers cannot decode is reported as unreadable, never as an error:
the hashes are written by scripts other versions may have.
"""

from __future__ import annotations

from typing import Any

from actors.api import bodies
from actors.api.problems import invalid
from actors.store.notes import (
    NotRun,
    check_note,
    decode_not_run,
    decode_note,
    describe_not_run,
    describe_note,
    shown,
)
from actors.store.tasks import TaskStore


def note_param(body: bytes) -> str | None:
    """The note a pause or resume request carries, if any (checked: 422 otherwise)."""
    if not body.strip():
        return None
    data = bodies.json_object(body)
    unknown = sorted(set(data) - {"note"})
    if unknown:
        raise invalid("; ".join(f"{k}: unknown key (known keys: note)" for k in unknown))
    note = data.get("note")
    return None if note is None else check_note(note)


async def note_of(store: TaskStore, task_id: str) -> dict[str, Any] | None:
    """The task's note with all its fields, or None."""
    keys = await store.keys()
    raw = await store.client.execute("HGET", keys.notes(keys.partition_of(task_id)), task_id)
    return decode_note(raw)


async def note_facts(store: TaskStore, task_id: str) -> dict[str, Any]:
    """Explain's ``note`` and ``not_run`` facts (each None when the task has none):
    ``not_run`` is ``{count, reason, due_ms, blocking_due_ms}``, or ``{unreadable}``."""
    keys = await store.keys()
    partition = keys.partition_of(task_id)
    note, not_run = await store.client.pipeline(
        [
            ("HGET", keys.notes(partition), task_id),
            ("HGET", keys.not_run(partition), task_id),
        ]
    )
    record = decode_not_run(not_run) if not_run is not None else None
    return {
        "note": decode_note(note),
        "not_run": (
            None
            if not_run is None
            else record.to_dict()
            if record is not None
            else {"unreadable": shown(not_run)}
        ),
    }


def note_sentences(facts: dict[str, Any]) -> list[str]:
    """The sentences ``note_facts`` adds to explain's summary."""
    lines = []
    if facts["note"] is not None:
        lines.append(describe_note(facts["note"]))
    record = facts["not_run"]
    if record is not None and "unreadable" in record:
        lines.append(f"a not-run record is stored but cannot be read: {record['unreadable']!r}")
    elif record is not None:
        lines.append(describe_not_run(NotRun(**record)))
    return lines
