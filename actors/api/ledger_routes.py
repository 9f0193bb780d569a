"""The occurrence ledger's endpoints: a task's history (``GET /v1/tasks/{task_id}/history``),
the attention list (``GET /v1/attention``) and an operator's acknowledgement that takes a
task off it (``POST /v1/tasks/{task_id}/acknowledge``). The store keeps both as fates are
written (``actors.store.ledger``); these check the input and shape the answers.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from actors.api import bodies
from actors.api import openapi_parts as oa
from actors.api.problems import invalid
from actors.api.routes import Call, ok
from actors.api.task_notes import note_param
from actors.store.history import FATE_NAMES, ORIGINS
from actors.store.ledger import (
    MAX_PAGE,
    REASONS,
    acknowledge,
    attention_page,
    task_history,
)
from runtime.logging import emit_events

#: The API actor's lines (``acknowledged``) name it.
_ACTOR = "node/api"


async def history(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    limit = bodies.limit_param(call.request.query_params, MAX_PAGE)
    occurrences = await task_history(call.store, task_id, limit)
    return ok({"task_id": task_id, "history": [o.to_dict() for o in occurrences]})


async def attention(call: Call) -> Response:
    query = call.request.query_params
    task_type = query.get("type")
    if task_type is not None:
        bodies.name_param("type", task_type)
    reason = query.get("reason")
    if reason is not None and reason not in REASONS:
        raise invalid(f"reason: must be one of {', '.join(REASONS)}, got {reason!r}")
    entries, cursor = await attention_page(  # a cursor it did not give: InvalidTask, 422
        call.store,
        task_type=task_type,
        reason=reason,
        limit=bodies.limit_param(query, 100),
        cursor=query.get("cursor"),
    )
    return ok({"items": [e.to_dict() for e in entries], "cursor": cursor})


async def acknowledge_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    note = note_param(call.body)
    now = await call.store.now_ms()
    entry = await acknowledge(call.store, task_id, note, call.key_id, now)
    emit_events(
        _ACTOR,
        [
            (
                "acknowledged",
                {
                    "task_id": task_id,
                    "reason": entry.reason if entry else None,
                    "note": note,
                    "key": call.key_id,
                },
            )
        ],
    )
    return ok(
        {
            "task_id": task_id,
            "acknowledged": entry is not None,
            "entry": entry.to_dict() if entry else None,
        }
    )


_ENTRY = oa._obj(
    ["task_id", "type", "reason", "since_ms", "due_ms", "error"],
    {
        "task_id": oa._STR,
        "type": oa._STR,
        "reason": {"enum": list(REASONS)},
        "since_ms": {**oa._INT, "description": "when the task came on the list for this reason"},
        "due_ms": {**oa._INT, "description": "the grid time of the occurrence that put it there"},
        "error": oa._nullable(oa._STR),
    },
)

#: The answers of these endpoints in the OpenAPI document (``actors.api.openapi``).
SCHEMAS: dict[str, Any] = {
    "History": oa._obj(
        ["task_id", "history"],
        {
            "task_id": oa._STR,
            "history": {
                "type": "array",
                "description": "newest first",
                "items": oa._obj(
                    [
                        "fate",
                        "reason",
                        "origin",
                        "attempt",
                        "due_ms",
                        "started_ms",
                        "finished_ms",
                        "node",
                        "error",
                    ],
                    {
                        "fate": {"enum": list(FATE_NAMES)},
                        "reason": oa._nullable({"enum": ["overlap", "misfire", "expired"]}),
                        "origin": {"enum": list(ORIGINS)},
                        "attempt": {**oa._INT, "description": "7 stands for 7 or more"},
                        "due_ms": oa._INT,
                        "started_ms": oa._nullable(oa._INT),
                        "finished_ms": oa._nullable(oa._INT),
                        "node": oa._nullable(oa._STR),
                        "error": oa._nullable(oa._STR),
                    },
                ),
            },
        },
    ),
    "AttentionPage": oa._obj(
        ["items", "cursor"],
        {"items": {"type": "array", "items": _ENTRY}, "cursor": oa._nullable(oa._STR)},
    ),
    "Acknowledged": oa._obj(
        ["task_id", "acknowledged", "entry"],
        {"task_id": oa._STR, "acknowledged": oa._BOOL, "entry": oa._nullable(_ENTRY)},
    ),
}
