"""The OpenAPI schemas of notes and not-run records (``actors.api.task_notes``): the
bodies pause and resume take, and what GET /v1/tasks/{task_id} and explain answer."""

from __future__ import annotations

from typing import Any

from actors.store.notes import MAX_NOTE_CHARS

_STR = {"type": "string"}
_INT = {"type": "integer"}
_UNREADABLE = {"type": "string", "description": "the start of a stored value not readable"}


def _obj(props: dict[str, Any], extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "required": [], "properties": props, "additionalProperties": extra}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


NOTE_SCHEMAS: dict[str, Any] = {
    "Flight": _obj(
        {
            "in_flight_due_ms": _nullable(_INT),
            "cancel_requested": {"type": "boolean"},
            "waiting": {"type": "array", "items": _INT, "description": "the first ten"},
            "waiting_count": _INT,
            "dead_streak": _INT,
            "unreadable": _UNREADABLE,
        }
    ),
    "TriggerBody": _obj(
        {
            "overlap": {
                "enum": ["allow_all", "skip", "buffer_one", "buffer_all", "cancel_other"],
                "description": "the overlap policy this fire runs under (default allow_all: it "
                "runs whatever is in flight)",
            }
        }
    ),
    "NoteBody": _obj(
        {
            "note": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": MAX_NOTE_CHARS,
                "description": "why (no control characters but newline and tab); kept with "
                "the change, shown by GET /v1/tasks/{task_id} and explain",
            }
        }
    ),
    "Note": _obj(
        {
            "note": _STR,
            "action": {"type": "string", "description": "pause or resume"},
            "at_ms": _INT,
            "by": {"type": "string", "description": "the API key that asked"},
            "reason": {
                "type": "string",
                "description": "failures: paused after pause_after_failures dead fires",
            },
            "failures": _INT,
            "unreadable": _UNREADABLE,
        },
        extra=True,
    ),
    "NotRun": _obj(
        {
            "count": _INT,
            "reason": {
                "type": "string",
                "description": (
                    "overlap, expired, stopped, updated, misfire_skip, coalesced or misfire_cap"
                ),
            },
            "due_ms": _INT,
            "blocking_due_ms": _nullable(_INT),
            "unreadable": _UNREADABLE,
        }
    ),
}
