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
    moment,
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
    """Explain's ``note``, ``not_run``, ``flight`` and ``parked_ms`` facts (each None when
    the task has none): ``not_run`` is ``{count, reason, due_ms, blocking_due_ms}``, or
    ``{unreadable}``; ``parked_ms`` as ``parked_on`` says."""
    keys = await store.keys()
    partition = keys.partition_of(task_id)
    note, not_run, flight, mark = await store.client.pipeline(
        [
            ("HGET", keys.notes(partition), task_id),
            ("HGET", keys.not_run(partition), task_id),
            ("HGET", keys.flights(partition), task_id),
            ("HGET", keys.parked(partition), task_id),
        ]
    )
    rejected = next((r for r in (note, not_run, flight) if isinstance(r, Exception)), None)
    if rejected is not None:  # a key of another kind: redis_rejected (the park mark's
        raise rejected  # alone reads as no mark, as ``parked_on`` reads it)
    record = decode_not_run(not_run) if not_run is not None else None
    return {
        "flight": flight_facts(flight),
        "parked_ms": _parked_time(flight, mark),
        "note": decode_note(note),
        "not_run": (
            None
            if not_run is None
            else record.to_dict()
            if record is not None
            else {"unreadable": shown(not_run)}
        ),
    }


async def parked_on(store: TaskStore, task_id: str) -> int | None:
    """The time the task is parked on (kept due for the fires waiting behind its fire in
    flight, its grid ended: ``mark_parked`` in ``lua/flight.lua``), counted already and no
    fire to come; None when it is not parked (its mark not its flight's latest decided
    time, the record's last field) or a record cannot be read."""
    keys = await store.keys()
    partition = keys.partition_of(task_id)
    flight, mark = await store.client.pipeline(
        [("HGET", keys.flights(partition), task_id), ("HGET", keys.parked(partition), task_id)]
    )
    return _parked_time(flight, mark)


def _parked_time(flight: Any, mark: Any) -> int | None:
    """The park time a task's flight record and park mark say (``parked_on``)."""
    if not isinstance(flight, bytes) or not isinstance(mark, bytes) or b"|" not in flight:
        return None
    decided = flight.rpartition(b"|")[2]
    return int(mark) if mark == decided and mark.isdigit() and len(mark) < 16 else None


def flight_facts(raw: bytes | None) -> dict[str, Any] | None:
    """A task's fire in flight and the fires waiting behind it (``lua/flight.lua``):
    ``{in_flight_due_ms, cancel_requested, waiting, dead_streak}``; None when none of them."""
    if raw is None:
        return None
    fields = raw.decode(errors="replace").split("|")
    # the streak: 'n', or 'n:due' (the last dead end counted)
    counted = fields[2].split(":")[0] if len(fields) > 2 else ""
    if len(fields) < 4 or not all(f.isdecimal() or not f for f in (*fields[:2], counted)):
        return {"unreadable": shown(raw)}
    waiting = [int(w.lstrip("m")) for w in fields[3].split(",") if w.lstrip("m").isdecimal()]
    streak = int(counted) if counted else 0
    if not fields[0] and not waiting and not streak:
        return None
    return {
        "in_flight_due_ms": int(fields[0]) if fields[0] else None,
        "cancel_requested": bool(fields[1]),
        "waiting": waiting[:10],
        "waiting_count": len(waiting),
        "dead_streak": streak,
    }


def flight_sentence(flight: dict[str, Any]) -> str:
    if "unreadable" in flight:
        return f"a flight record is stored but cannot be read: {flight['unreadable']!r}"
    parts = []
    if flight["in_flight_due_ms"] is not None:
        due = moment(flight["in_flight_due_ms"])
        asked = ", asked to cancel by a newer fire" if flight["cancel_requested"] else ""
        parts.append(f"the fire due {due} is in flight (queued, running or retrying{asked})")
    if flight["waiting_count"]:
        first = moment(flight["waiting"][0])
        parts.append(f"{flight['waiting_count']} fire(s) wait for it, the first due {first}")
    if flight["dead_streak"]:
        parts.append(f"{flight['dead_streak']} fire(s) in a row ended dead")
    return "; ".join(parts)


def note_sentences(facts: dict[str, Any]) -> list[str]:
    """The sentences ``note_facts`` adds to explain's summary."""
    lines = []
    if facts.get("flight") is not None:
        lines.append(flight_sentence(facts["flight"]))
    if facts["note"] is not None:
        lines.append(describe_note(facts["note"]))
    record = facts["not_run"]
    if record is not None and "unreadable" in record:
        lines.append(f"a not-run record is stored but cannot be read: {record['unreadable']!r}")
    elif record is not None:
        lines.append(describe_not_run(NotRun(**record)))
    return lines
