"""The backfill endpoints: run the grid times of a past window, for one task
(``POST /v1/tasks/{task_id}/backfill``) or every active or paused task of a type
(``POST /v1/backfill``). The store does the work (``actors.store.backfill``); these check
the body and apply the node's bounds (``[api] backfill_max_fires``, ``backfill_rate``).
"""

from __future__ import annotations

from typing import Any, get_args

import attrs
from starlette.responses import Response

from actors.api import bodies
from actors.api import openapi_parts as oa
from actors.api.problems import invalid
from actors.api.routes import Call, ok
from actors.domain.schedules import Overlap


@attrs.frozen
class TaskBackfillBody:
    start_ms: int
    end_ms: int
    overlap: str | None = None
    """The policy the fires run under (checked by the store against ``Overlap``);
    default: the task's own."""
    dry_run: bool = False


@attrs.frozen
class TypeBackfillBody:
    type: str
    start_ms: int
    end_ms: int
    dry_run: bool = False


async def backfill_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    body = bodies.structure(call.body, TaskBackfillBody)
    settings = call.services.settings
    done = await call.store.backfill(
        task_id, body.start_ms, body.end_ms, overlap=body.overlap, dry_run=body.dry_run,
        max_fires=settings.backfill_max_fires, rate=settings.backfill_rate,
    )  # fmt: skip
    return ok(done.to_dict(body.start_ms, body.end_ms, body.dry_run))


async def backfill_type(call: Call) -> Response:
    body = bodies.structure(call.body, TypeBackfillBody)
    task_type = bodies.name_param("type", body.type)
    settings = call.services.settings
    declared = settings.task_types
    if declared and task_type not in declared:
        raise invalid(
            f"type: unknown task type {task_type!r}; this namespace declares: "
            + ", ".join(declared)
        )
    done = await call.store.backfill_type(
        task_type, body.start_ms, body.end_ms, dry_run=body.dry_run,
        max_fires=settings.backfill_max_fires, rate=settings.backfill_rate,
    )  # fmt: skip
    return ok(
        {
            "type": task_type,
            "start_ms": body.start_ms,
            "end_ms": body.end_ms,
            "dry_run": body.dry_run,
            "tasks": [b.counts() for b in done],
            "fires": sum(len(b.fires) for b in done),
            "enqueued": sum(b.enqueued for b in done),
            "already_backfilled": sum(b.already for b in done),
            "held_back": sum(b.held_back for b in done),
            "skipped": sum(b.skipped for b in done),
        }
    )


#: The bodies and answers of these endpoints in the OpenAPI document (``actors.api.openapi``).
SCHEMAS: dict[str, Any] = {
    "TaskBackfill": oa._obj(
        ["start_ms", "end_ms"],
        {
            "start_ms": {**oa._INT, "description": "window start, Unix ms (inclusive)"},
            "end_ms": {
                **oa._INT,
                "description": "window end, Unix ms (exclusive; not in the future)",
            },
            "overlap": {
                "enum": list(get_args(Overlap)),
                "description": "the policy the fires run under (default: the task's own)",
            },
            "dry_run": {**oa._BOOL, "description": "write nothing, answer what would run"},
        },
    ),
    "TaskBackfilled": oa._obj(
        [
            "task_id",
            "type",
            "start_ms",
            "end_ms",
            "overlap",
            "dry_run",
            "fires",
            "enqueued",
            "already_backfilled",
            "held_back",
            "skipped",
        ],
        {
            "task_id": oa._STR,
            "type": oa._STR,
            "start_ms": oa._INT,
            "end_ms": oa._INT,
            "overlap": {"enum": list(get_args(Overlap))},
            "dry_run": oa._BOOL,
            "fires": {
                "type": "array",
                "items": oa._obj(
                    ["due_ms", "schedule_id"], {"due_ms": oa._INT, "schedule_id": oa._STR}
                ),
            },
            "enqueued": oa._INT,
            "already_backfilled": oa._INT,
            "held_back": oa._INT,
            "skipped": oa._INT,
        },
    ),
    "TypeBackfill": oa._obj(
        ["type", "start_ms", "end_ms"],
        {"type": oa._NAME, "start_ms": oa._INT, "end_ms": oa._INT, "dry_run": oa._BOOL},
    ),
    "TypeBackfilled": oa._obj(
        [
            "type",
            "start_ms",
            "end_ms",
            "dry_run",
            "tasks",
            "fires",
            "enqueued",
            "already_backfilled",
            "held_back",
            "skipped",
        ],
        {
            "type": oa._STR,
            "start_ms": oa._INT,
            "end_ms": oa._INT,
            "dry_run": oa._BOOL,
            "tasks": {
                "type": "array",
                "items": oa._obj(
                    [
                        "task_id",
                        "fires",
                        "enqueued",
                        "already_backfilled",
                        "held_back",
                        "skipped",
                    ],
                    {
                        "task_id": oa._STR,
                        "fires": oa._INT,
                        "enqueued": oa._INT,
                        "already_backfilled": oa._INT,
                        "held_back": oa._INT,
                        "skipped": oa._INT,
                    },
                ),
            },
            "fires": oa._INT,
            "enqueued": oa._INT,
            "already_backfilled": oa._INT,
            "held_back": oa._INT,
            "skipped": oa._INT,
        },
    ),
}
