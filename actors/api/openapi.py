"""The OpenAPI 3.1 document of the API, served at ``/openapi.json``.

Written by hand beside the routes (the routes are thin; the schemas are the contract) and
checked against the running app by schemathesis in the test suite: every response must
match what is declared here. ``docs/API.md`` is the prose companion.
"""

from __future__ import annotations

from typing import Any

VERSION = "1.0.0"

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$", "maxLength": 64}
_TASK_ID = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$", "maxLength": 128}
_ENTRY_ID = {"type": "string", "pattern": "^[0-9]{1,20}-[0-9]{1,20}$"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], props: dict[str, Any], extra: bool = False) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": props,
        "additionalProperties": extra,
    }


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
            "kind": {"enum": ["interval", "cron", "once"]},
            "every_s": {"type": "number", "description": "interval: seconds between fires"},
            "cron": {"type": "string", "description": "cron: five-field expression"},
            "tz": {"type": "string", "description": "cron: IANA time zone (default UTC)"},
            "at_ms": {"type": "integer", "description": "once: Unix ms"},
            "start_ms": _INT,
            "end_ms": _INT,
            "max_runs": _INT,
            "jitter_s": _NUM,
            "misfire": {"enum": ["coalesce", "skip", "fire_all"]},
            "misfire_cap": _INT,
        },
    ),
    "TaskCreate": _obj(
        ["type", "schedule"],
        {"type": _NAME, "schedule": _ref("Schedule"), "payload": {}, "task_id": _TASK_ID},
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
        ],
        {
            "task_id": _STR,
            "type": _STR,
            "payload": {},
            "schedule": _ref("Schedule"),
            "status": {"enum": ["active", "paused", "stopped", "finished"]},
            "created_ms": _INT,
            "updated_ms": _INT,
            "next_run_ms": _nullable(_INT),
            "fires": _INT,
            "runs": _INT,
            "retries": _INT,
            "last_run_ms": _nullable(_INT),
            "last_status": _nullable(_STR),
            "last_error": _nullable(_STR),
        },
    ),
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
        {"tasks": {"type": "array", "items": _ref("Task")}, "next_cursor": _nullable(_STR)},
    ),
    "TaskUpdate": _obj([], {"payload": {}, "schedule": _ref("Schedule")}),
    "TaskStatus": _obj(["task_id", "status"], {"task_id": _STR, "status": _STR}),
    "Triggered": _obj(["task_id", "schedule_id"], {"task_id": _STR, "schedule_id": _STR}),
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
        {"summary": {"type": "array", "items": _STR}},
        extra=True,
    ),
    "Clear": _obj(["confirm"], {"confirm": _STR}),
    "Cleared": _obj(["type", "deleted"], {"type": _STR, "deleted": _INT}),
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
    "Health": _obj(["status"], {"status": _STR}),
    "Ready": _obj(
        ["ready", "redis", "actors_down"],
        {
            "ready": _BOOL,
            "redis": _BOOL,
            "actors_down": {"type": "object", "additionalProperties": _STR},
        },
    ),
}


def _json(schema: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _ref(schema)}}}


def _problems(*statuses: int) -> dict[str, Any]:
    problem = {"content": {"application/problem+json": {"schema": _ref("Problem")}}}
    return {str(s): {"description": "problem details (RFC 9457)", **problem} for s in statuses}


_SIGNED = (400, 401, 403, 413, 422, 503)


def _op(
    summary: str,
    ok: dict[int, str],
    *,
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    problems: tuple[int, ...] = (),
    public: bool = False,
) -> dict[str, Any]:
    responses = {
        str(status): {"description": "OK", **_json(schema)} for status, schema in ok.items()
    }
    responses.update(_problems(*(() if public else _SIGNED), *problems))
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": True, **_json(body)}
    if public:
        op["security"] = []
    return op


def _path(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


_ID = [_path("task_id", _TASK_ID)]
_TYPE = [_path("type", _NAME)]
_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000})


def openapi_document() -> dict[str, Any]:
    paths = {
        "/healthz": {"get": _op("The process is up", {200: "Health"}, public=True)},
        "/readyz": {
            "get": _op(
                "Redis reachable and every actor running", {200: "Ready", 503: "Ready"}, public=True
            )
        },
        "/v1/tasks": {
            "post": _op(
                "Create a task (idempotent with a client-given task_id)",
                {201: "Created", 200: "Created"},
                body="TaskCreate",
                problems=(409,),
            ),
            "get": _op(
                "List tasks, filtered by type and status (cursor pagination)",
                {200: "TaskPage"},
                params=[
                    _query("type", _NAME),
                    _query("status", {"enum": ["active", "paused", "stopped", "finished"]}),
                    _query("cursor", _STR),
                    _LIMIT,
                ],
            ),
        },
        "/v1/tasks/bulk": {
            "post": _op(
                "Create many tasks (up to [api] max_bulk)", {200: "BulkCreated"}, body="BulkCreate"
            )
        },
        "/v1/tasks/{task_id}": {
            "get": _op("One task", {200: "Task"}, params=_ID, problems=(404,)),
            "patch": _op(
                "Replace payload and/or schedule",
                {200: "TaskStatus"},
                body="TaskUpdate",
                params=_ID,
                problems=(404, 409),
            ),
            "delete": _op("Delete a task", {200: "Deleted"}, params=_ID, problems=(404,)),
        },
        **{
            f"/v1/tasks/{{task_id}}/{action}": {
                "post": _op(
                    f"{action.capitalize()} a task",
                    {200: "TaskStatus"},
                    params=_ID,
                    problems=(404, 409),
                )
            }
            for action in ("pause", "resume", "stop")
        },
        "/v1/tasks/{task_id}/trigger": {
            "post": _op(
                "Run a task now, once, outside its schedule",
                {202: "Triggered"},
                params=_ID,
                problems=(404,),
            )
        },
        "/v1/tasks/{task_id}/explain": {
            "get": _op(
                "Why this task is or is not running",
                {200: "Explanation"},
                params=_ID,
                problems=(404,),
            )
        },
        "/v1/types/{type}/clear": {
            "post": _op(
                "Delete every task of a type (confirm must repeat the type)",
                {200: "Cleared"},
                body="Clear",
                params=_TYPE,
            )
        },
        "/v1/queues": {"get": _op("Backlog of every type", {200: "Queues"})},
        "/v1/queues/{type}": {"get": _op("Backlog of one type", {200: "Queue"}, params=_TYPE)},
        "/v1/dlq/{type}": {
            "get": _op(
                "Dead letters of a type, newest first",
                {200: "DeadLetterPage"},
                params=[*_TYPE, _query("before", _ENTRY_ID), _LIMIT],
            )
        },
        "/v1/dlq/{type}/{entry_id}": {
            "get": _op(
                "One dead letter",
                {200: "DeadLetter"},
                params=[*_TYPE, _path("entry_id", _ENTRY_ID)],
                problems=(404,),
            )
        },
        "/v1/dlq/{type}/replay": {
            "post": _op(
                "Move dead letters back to the queue as first attempts",
                {200: "Replayed"},
                body="Entries",
                params=_TYPE,
            )
        },
        "/v1/dlq/{type}/purge": {
            "post": _op(
                "Delete dead letters (all needs confirm = the type)",
                {200: "Purged"},
                body="Entries",
                params=_TYPE,
            )
        },
    }
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
            "schemas": SCHEMAS,
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
