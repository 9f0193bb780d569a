"""The OpenAPI 3.1 document of the API, served at ``/openapi.json``.

Its paths are generated from the route table (``actors.api.app.ROUTES``: method, path,
summary, responses, body, query parameters); parameter schemas, the name pattern, statuses
and enums come from where they are defined (``runtime.config.NAME_PATTERN``,
``actors.domain``); the body and response schemas are the contract, written here. The
test suite checks the running app against it with schemathesis: every response must
match what is declared here. ``docs/API.md`` is the prose companion.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from actors.api.bodies import MAX_PAGE
from actors.api.endpoint import Endpoint
from actors.api.openapi_labels import LABEL_FILTER, LABELS
from actors.api.openapi_notes import NOTE_SCHEMAS
from actors.api.openapi_ops import OPERATOR_SCHEMAS
from actors.api.openapi_parts import (
    _BOOL,
    _ENTRY_ID,
    _INT,
    _NAME,
    _NUM,
    _STATUS,
    _STR,
    _TASK_ID,
    _nullable,
    _obj,
    _ref,
)
from actors.domain.model import MAX_CRON_CHARS
from actors.domain.preview import MAX_PREVIEW
from actors.domain.schedules import Kind, Misfire, Overlap
from actors.store.history import FATE_NAMES
from actors.store.ledger import REASONS
from actors.store.records import OUTCOME_NAMES

#: The version of this API document (the /v1 contract), not the release: that is
#: ``runtime.version.__version__``, which `/healthz` answers.
VERSION = "1.0.0"

SCHEMAS: dict[str, Any] = {
    "Problem": _obj(
        ["type", "title", "status", "code", "detail"],
        {
            "type": _STR,
            "title": _STR,
            "status": _INT,
            "code": _STR,
            "detail": _STR,
            "errors": {
                "type": "array",
                "items": _obj(["field", "message"], {"field": _STR, "message": _STR}),
            },
        },
    ),
    "Schedule": _obj(
        ["kind"],
        {
            "kind": {"enum": list(get_args(Kind))},
            "every_s": {"type": "number", "description": "interval: seconds between fires"},
            "cron": {
                "type": "string",
                "maxLength": MAX_CRON_CHARS,
                "description": "cron: five-field expression; H in minute/hour: from the task id",
            },
            "tz": {"type": "string", "description": "cron: IANA time zone (default UTC)"},
            "at_ms": {"type": "integer", "description": "once: Unix ms"},
            "start_ms": _INT,
            "end_ms": _INT,
            "max_runs": _INT,
            "jitter_s": _NUM,
            "misfire": {"enum": list(get_args(Misfire))},
            "misfire_cap": _INT,
            "overlap": {
                "enum": list(get_args(Overlap)),
                "description": "a fire due while an earlier one is in flight (default allow_all)",
            },
            "catchup_window_s": {
                "type": ["number", "null"],
                "description": "a fire later than this is not run (default: no limit)",
            },
            "spread_s": {
                "type": "number",
                "description": "a fixed offset in [0, spread_s) chosen from the task id",
            },
            "pause_after_failures": {
                "type": ["integer", "null"],
                "description": "pause after this many dead fires in a row (default: never)",
            },
        },
    ),
    "TaskCreate": _obj(
        ["type", "schedule"],
        {
            "type": _NAME,
            "schedule": _ref("Schedule"),
            "payload": {},
            "task_id": _TASK_ID,
            "labels": LABELS,
        },
    ),
    "Task": _obj(
        [
            "task_id",
            "type",
            "payload",
            "schedule",
            "status",
            "created_ms",
            "updated_ms",
            "next_run_ms",
            "fires",
            "runs",
            "retries",
            "last_run_ms",
            "last_status",
            "last_error",
            "labels",
            "last_fate",
        ],
        {
            "task_id": _STR,
            "type": _STR,
            "payload": {},
            "schedule": _ref("Schedule"),
            "status": _STATUS,
            "created_ms": _INT,
            "updated_ms": _INT,
            "next_run_ms": _nullable(_INT),
            "fires": _INT,
            "runs": _INT,
            "retries": _INT,
            "last_run_ms": _nullable(_INT),
            "last_status": _nullable(_STR),
            "last_error": _nullable(_STR),
            "labels": LABELS,
            "last_fate": _nullable({"enum": list(FATE_NAMES)}),
            "note": _nullable(_ref("Note")),
        },
    ),
    **NOTE_SCHEMAS,
    "Created": _obj(["task_id", "created"], {"task_id": _STR, "created": _BOOL}),
    "BulkCreate": _obj(["tasks"], {"tasks": {"type": "array", "items": _ref("TaskCreate")}}),
    "BulkCreated": _obj(
        ["created", "existing", "conflicts", "results"],
        {
            "created": _INT,
            "existing": _INT,
            "conflicts": _INT,
            "results": {
                "type": "array",
                "items": _obj(
                    ["task_id", "created", "conflict"],
                    {"task_id": _STR, "created": _BOOL, "conflict": _BOOL},
                ),
            },
        },
    ),
    "TaskPage": _obj(
        ["tasks", "next_cursor"],
        {
            "tasks": {"type": "array", "items": _ref("Task")},
            "next_cursor": _nullable(_STR),
            "unreadable": {
                "type": "array",
                "description": "tasks of the page whose stored records cannot be read "
                "(left out of tasks; present only when there are some)",
                "items": _obj(["task_id", "error"], {"task_id": _STR, "error": _STR}),
            },
        },
    ),
    "TaskUpdate": _obj([], {"payload": {}, "schedule": _ref("Schedule"), "labels": LABELS}),
    "TaskStatus": _obj(["task_id", "status"], {"task_id": _STR, "status": _STR}),
    "Triggered": _obj(
        ["task_id", "schedule_id", "queued"],
        {"task_id": _STR, "schedule_id": _STR, "queued": _BOOL},
    ),
    "Deleted": _obj(["task_id", "deleted"], {"task_id": _STR, "deleted": _BOOL}),
    "Explanation": _obj(
        [
            "task_id",
            "status",
            "summary",
            "next_run_ms",
            "in_schedule_index",
            "retries",
            "stream",
            "dead_letters",
            "last_error",
        ],
        {
            "summary": {"type": "array", "items": _STR},
            "note": _nullable(_ref("Note")),
            "not_run": _nullable(_ref("NotRun")),
            "flight": _nullable(_ref("Flight")),
        },
        extra=True,
    ),
    "PlannedFire": _obj(
        ["due_ms", "due", "local", "fire_ms", "fire", "note"],
        {
            "due_ms": _INT,
            "due": {**_STR, "description": "the grid time (the fire's due_ms), UTC"},
            "local": {**_STR, "description": "the grid time in the schedule's zone"},
            "fire_ms": _INT,
            "fire": {**_STR, "description": "when it is enqueued: grid time + spread, UTC"},
            "note": {**_nullable(_STR), "description": "what a DST change did to it"},
        },
    ),
    "Upcoming": _obj(
        ["task_id", "status", "now_ms", "tz", "offset_ms", "fires", "notes"],
        {
            "task_id": _STR,
            "status": _STATUS,
            "now_ms": _INT,
            "tz": _STR,
            "offset_ms": {**_INT, "description": "the task's spread offset"},
            "fires": {"type": "array", "items": _ref("PlannedFire")},
            "notes": {"type": "array", "items": _STR},
        },
    ),
    "Clear": _obj(["confirm"], {"confirm": _STR}),
    "Cleared": _obj(["type", "deleted"], {"type": _STR, "deleted": _INT}),
    **OPERATOR_SCHEMAS,
}


def _json(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(schema)}}}


def _problems(*statuses: int) -> dict[str, Any]:
    problem = {"content": {"application/problem+json": {"schema": _ref("Problem")}}}
    return {str(s): {"description": "problem details (RFC 9457)", **problem} for s in statuses}


_SIGNED = (400, 401, 403, 408, 413, 422, 503)


def _op(route: Endpoint) -> dict[str, Any]:
    responses = {
        str(status): {"description": "OK", **_json(schema)} for status, schema in route.ok.items()
    }
    responses.update(_problems(*(() if route.public else _SIGNED), *route.problems))
    op: dict[str, Any] = {"summary": route.summary, "responses": responses}
    params = [
        {"name": name, "in": "path", "required": True, "schema": PARAMS[name]}
        for name in re.findall(r"{(\w+)}", route.path)
    ] + [
        {"name": name, "in": "query", "required": False, "schema": PARAMS[name]}
        for name in route.query
    ]
    if params:
        op["parameters"] = params
    if route.body:
        op["requestBody"] = {"required": not route.body_optional, **_json(route.body)}
    if route.public:
        op["security"] = []
    return op


#: Every path and query parameter of the route table, by name.
PARAMS: dict[str, dict[str, Any]] = {
    "task_id": _TASK_ID,
    "type": _NAME,
    "entry_id": _ENTRY_ID,
    "action_id": _NAME,
    "status": _STATUS,
    "label": LABEL_FILTER,
    "next_before": {"type": "integer", "minimum": 0, "maximum": 10**15},
    "last_status": {"enum": list(OUTCOME_NAMES)},
    "last_fate": {"enum": list(FATE_NAMES)},
    "reason": {"enum": list(REASONS)},
    "cursor": _STR,
    "before": _ENTRY_ID,
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_PREVIEW},
}


def openapi_document(
    routes: Sequence[Endpoint], more_schemas: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The document of these endpoints (``actors.api.app.ROUTES``); ``more_schemas``: the
    body and response schemas an endpoint module declares next to its endpoints."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _op(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Metronome API",
            "version": VERSION,
            "description": (
                "Manage, explain and inspect periodic tasks, queues and dead letters. Every "
                "/v1 request is signed: see docs/API.md (HMAC-SHA256 over method, path with "
                "query, timestamp, nonce and body SHA-256, under a key id)."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {**SCHEMAS, **(more_schemas or {})},
            "securitySchemes": {
                "signature": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Metronome-Signature",
                    "description": "with X-Metronome-Key, X-Metronome-Timestamp and "
                    "X-Metronome-Nonce; see docs/API.md",
                }
            },
        },
        "security": [{"signature": []}],
    }
