"""The OpenAPI schemas of the operators' answers: queues, dead letters, probes, nodes and
partitions (``actors.api.openapi`` puts them in its document)."""

from __future__ import annotations

from typing import Any

from actors.api.openapi_parts import _BOOL, _ENTRY_ID, _INT, _STR, _nullable, _obj, _ref

OPERATOR_SCHEMAS: dict[str, Any] = {
    "Queue": _obj(
        [
            "type",
            "length",
            "undelivered",
            "pending",
            "oldest_pending_age_ms",
            "consumers",
            "retrying",
            "dead_letters",
        ],
        {
            "type": _STR,
            "length": _INT,
            "undelivered": _nullable(_INT),
            "pending": _INT,
            "oldest_pending_age_ms": _nullable(_INT),
            "consumers": {
                "type": "array",
                "items": _obj(
                    ["name", "pending", "idle_ms"], {"name": _STR, "pending": _INT, "idle_ms": _INT}
                ),
            },
            "retrying": _nullable(_INT),
            "dead_letters": _INT,
            "now_ms": _INT,
        },
    ),
    "Queues": _obj(
        ["now_ms", "retrying_total", "queues"],
        {
            "now_ms": _INT,
            "retrying_total": _INT,
            "queues": {"type": "array", "items": _ref("Queue")},
        },
    ),
    "DeadLetter": _obj(["entry_id", "dead_ms"], {"entry_id": _STR, "dead_ms": _INT}, extra=True),
    "DeadLetterPage": _obj(
        ["dead_letters", "next_cursor"],
        {
            "dead_letters": {"type": "array", "items": _ref("DeadLetter")},
            "next_cursor": _nullable(_STR),
        },
    ),
    "Entries": _obj(
        [],
        {
            "entry_ids": {"type": "array", "items": _ENTRY_ID, "minItems": 1, "maxItems": 1000},
            "all": _BOOL,
            "confirm": _STR,
        },
    ),
    "Replayed": _obj(
        ["type", "replayed", "malformed", "missing"],
        {
            "type": _STR,
            "replayed": _INT,
            "malformed": _INT,
            "missing": _INT,
            "results": {"type": "object", "additionalProperties": _STR},
        },
    ),
    "Purged": _obj(["type", "purged"], {"type": _STR, "purged": _INT}),
    "Health": _obj(
        ["status", "version"],
        {"status": _STR, "version": {**_STR, "description": "the Metronome release it runs"}},
    ),
    "WhoAmI": _obj(["key_id", "read_only"], {"key_id": _STR, "read_only": _BOOL}),
    "Nodes": _obj(
        ["now_ms", "processes"],
        {
            "now_ms": _INT,
            "processes": {
                "type": "array",
                "items": _obj(
                    ["process", "pid", "seen_ms", "age_ms", "alive", "up", "down", "restarts"],
                    {
                        "process": _STR,
                        "pid": _INT,
                        "seen_ms": _INT,
                        "age_ms": _INT,
                        "alive": _BOOL,
                        "up": {"type": "array", "items": _STR},
                        "down": {"type": "object", "additionalProperties": _STR},
                        "restarts": {"type": "object", "additionalProperties": _INT},
                    },
                ),
            },
        },
    ),
    "Partitions": _obj(
        ["now_ms", "pollers", "partitions"],
        {
            "now_ms": _INT,
            "pollers": {"type": "array", "items": _STR},
            "partitions": {
                "type": "array",
                "items": _obj(
                    [
                        "partition",
                        "poller",
                        "lease_until_ms",
                        "live",
                        "claims_in_flight",
                        "due_now",
                        "next_due_ms",
                    ],
                    {
                        "partition": _INT,
                        "poller": _nullable(_STR),
                        "lease_until_ms": _nullable(_INT),
                        "live": _BOOL,
                        "claims_in_flight": _INT,
                        "due_now": _INT,
                        "next_due_ms": _nullable(_INT),
                    },
                ),
            },
        },
    ),
    "Ready": _obj(
        ["ready", "redis", "version"],
        {
            "ready": _BOOL,
            "redis": _BOOL,
            "version": {**_STR, "description": "the Metronome release it runs"},
            "actors_down": {
                "type": "object",
                "additionalProperties": _STR,
                "description": "actor path → why it is down; only for a signed request",
            },
            "redis_refusing": {
                **_STR,
                "description": "present while Redis refuses this process's steps: "
                "refused_write, permission or rejected",
            },
        },
    ),
}
