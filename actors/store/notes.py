"""What the partition's notes and not-run hashes hold, written and read in one place.

A **note** says why a task was paused or resumed: the operator's text, the action, when,
and which API key asked (``by``, when the request was signed). It lives in the
partition's notes hash (``Keys.notes``: task id -> compact JSON) and is written by the
script that changes the status (``set_status.lua``), so a note never describes a change
that did not happen. A note belongs to the task's latest pause or resume: a status change
without one removes the earlier note (it described a status the task has left), and
deleting the task deletes it. A task paused after a streak of dead fires
(``schedule.pause_after_failures``) gets its note from the consumer's outcome script:
the last error line as the text, with ``reason`` ``failures`` and ``failures`` (the
streak's length). Readers keep whatever fields a note carries and never fail on one:
a value that is not a JSON object is reported as unreadable.

A **not-run record** (``Keys.not_run``: task id -> ``"count reason due_ms
blocking_due_ms"``) counts the fires of a task that were not run and describes the last
one: why (``overlap``, ``expired``, ``stopped``, ``updated``, or a misfire policy's
reason), when it was due, and the fire still in flight that blocked it (``-`` when none).
"""

from __future__ import annotations

import datetime as dt
import json
import unicodedata
from typing import Any

import attrs

from actors.domain.errors import InvalidTask

#: The longest note accepted, in characters.
MAX_NOTE_CHARS = 500
#: How much of an unreadable stored value a reader shows.
_SHOWN = 200


def check_note(text: Any) -> str:
    """The note as given, or InvalidTask naming what is wrong: a string of 1 to
    ``MAX_NOTE_CHARS`` characters, without control characters other than newline and tab
    (it is shown in terminals and on the dashboard)."""
    if not isinstance(text, str):
        raise InvalidTask(f"note: must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidTask("note: must not be empty (leave it out for no note)")
    if len(text) > MAX_NOTE_CHARS:
        raise InvalidTask(f"note: at most {MAX_NOTE_CHARS} characters, got {len(text)}")
    if any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in text):
        raise InvalidTask("note: control characters (other than newline and tab) are not allowed")
    return text


def encode_note(text: str, action: str, at_ms: int, by: str | None = None) -> str:
    """The stored form: compact JSON, ``by`` left out when no key is known."""
    note: dict[str, Any] = {"note": check_note(text), "action": action, "at_ms": at_ms}
    if by is not None:
        note["by"] = by
    return json.dumps(note, separators=(",", ":"), ensure_ascii=False)


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def decode_note(raw: bytes | str | None) -> dict[str, Any] | None:
    """A stored note as a dict with all its fields (None when there is none); a value that
    is not a JSON object becomes ``{"unreadable": <its start>}``."""
    if raw is None:
        return None
    text = _text(raw)
    try:
        note = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the decoder's depth
        note = None
    if not isinstance(note, dict):
        return {"unreadable": text[:_SHOWN]}
    return note


@attrs.frozen
class NotRun:
    """A task's not-run record: how many fires were not run, and the last one's story."""

    count: int
    reason: str
    due_ms: int
    blocking_due_ms: int | None
    """The due time of the fire in flight that blocked it; None when none did."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def decode_not_run(raw: bytes | str) -> NotRun | None:
    """A stored not-run record, or None when it is malformed (the caller says so)."""
    parts = _text(raw).split()
    if len(parts) != 4:
        return None
    count, reason, due, blocking = parts
    if not (count.isdecimal() and due.isdecimal() and (blocking == "-" or blocking.isdecimal())):
        return None
    if not reason.replace("_", "").isalnum():
        return None
    return NotRun(int(count), reason, int(due), None if blocking == "-" else int(blocking))


def shown(raw: bytes | str) -> str:
    """The start of a stored value, for a message saying it cannot be read."""
    return _text(raw)[:_SHOWN]


def moment(ms: int | None, same_day_as: int | None = None) -> str:
    """A time in UTC as ``2026-12-03T12:00:00Z`` (milliseconds shown when not zero), or
    just ``12:00:00Z`` when it falls on the day of ``same_day_as``."""
    if ms is None:
        return "an unknown time"
    try:
        at = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
        day = dt.datetime.fromtimestamp(same_day_as / 1000, dt.UTC) if same_day_as else None
    except (ValueError, OverflowError, OSError):  # beyond what a date can say
        return str(ms)
    text = at.strftime("%H:%M:%S") + (f".{ms % 1000:03d}" if ms % 1000 else "") + "Z"
    return text if day is not None and day.date() == at.date() else f"{at:%Y-%m-%d}T{text}"


def describe_note(note: dict[str, Any]) -> str:
    """A note as one sentence: who paused or resumed the task, when, and why."""
    if "unreadable" in note:
        return f"a note is stored but cannot be read: {note['unreadable']!r}"
    at_ms = note.get("at_ms")
    when = f" at {moment(at_ms)}" if isinstance(at_ms, int) else ""
    text = note.get("note")
    if note.get("reason") == "failures":
        return f"paused after {note.get('failures', '?')} dead fires in a row{when}: {text}"
    verb = {"pause": "paused", "resume": "resumed", "stop": "stopped"}.get(
        str(note.get("action")), str(note.get("action"))
    )
    by = f" by key {note['by']}" if note.get("by") else ""
    return f"{verb}{when}{by}: {text}"


#: What each reason a fire was not run means, as the end of a sentence.
_NOT_RUN_WHY = {
    "expired": "was dropped (expired: later than its catch-up window)",
    "misfire_skip": "was skipped (misfire_skip: missed while nothing fired it, and its "
    "misfire policy skips missed fires)",
    "coalesced": "was folded into one later fire (coalesced: its misfire policy runs missed "
    "fires once)",
    "misfire_cap": "was not fired (misfire_cap: fire_all catches up at most misfire_cap "
    "missed fires)",
    "stopped": "was dropped (stopped: it waited behind the fire in flight when the task "
    "was stopped)",
    "updated": "was dropped (updated: it waited behind the fire in flight when the task "
    "was given a schedule without an overlap policy)",
    "paused": "was skipped (paused: it came while the task was paused, and a resume goes "
    "on from the next grid time)",
}


def describe_not_run(record: NotRun) -> str:
    """A not-run record as one sentence: how many, and why the last one did not run."""
    if record.reason == "overlap":
        blocker = (
            f"the fire due {moment(record.blocking_due_ms, record.due_ms)}"
            if record.blocking_due_ms is not None
            else "an earlier fire"
        )
        why = f"was skipped (overlap) while {blocker} was still in flight"
    else:
        why = _NOT_RUN_WHY.get(record.reason, f"was not run ({record.reason})")
    due = moment(record.due_ms)
    if record.count == 1:
        return f"1 fire not run: the one due {due} {why}"
    return f"{record.count} fires not run: the last, due {due}, {why}"
