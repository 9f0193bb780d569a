"""The API's route table and its Starlette app: the table is the one list of endpoints,
from which the routes, each endpoint's accepted query parameters and the OpenAPI document
are built."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from actors.api.action_routes import SCHEMAS as ACTION_SCHEMAS
from actors.api.action_routes import action_status, tasks_action
from actors.api.backfill_routes import SCHEMAS as BACKFILL_SCHEMAS
from actors.api.backfill_routes import backfill_task, backfill_type
from actors.api.endpoint import Endpoint
from actors.api.ledger_routes import SCHEMAS as LEDGER_SCHEMAS
from actors.api.ledger_routes import acknowledge_task, attention, history
from actors.api.openapi import openapi_document
from actors.api.problems import Problem
from actors.api.queue_routes import (
    list_dead,
    purge_dead,
    purge_queue,
    queue,
    queues,
    replay_dead,
    show_dead,
)
from actors.api.routes import (
    ApiServices,
    bulk_create,
    clear_type,
    create_task,
    delete_task,
    endpoint_for,
    explain_task,
    get_task,
    healthz,
    list_tasks,
    metrics,
    nodes,
    partitions,
    readyz,
    transition,
    trigger_task,
    update_task,
    whoami,
)
from actors.api.unread_body import ReadUnreadBody
from actors.api.upcoming import upcoming_fires
from actors.observability.endpoint import SecurityHeaders

E = Endpoint
DASHBOARD = Path(__file__).parent.parent / "observability" / "dashboard"
#: Every endpoint. Order matters where paths overlap (bulk before {task_id}).
ROUTES: list[Endpoint] = [
    E("GET", "/healthz", healthz, "The process is up", {200: "Health"}, public=True),
    E("GET", "/readyz", readyz, "Redis reachable and every actor running",
      {200: "Ready", 503: "Ready"}, public=True),
    E("POST", "/v1/tasks", create_task, "Create a task (idempotent with a client-given task_id)",
      {201: "Created", 200: "Created"}, body="TaskCreate", problems=(409,)),
    E("GET", "/v1/tasks", list_tasks,
      "List tasks, filtered by type, status, labels, next fire and last outcome (cursor "
      "pagination)", {200: "TaskPage"},
      query=("type", "status", "label", "next_before", "last_status", "last_fate", "cursor",
             "limit")),
    E("POST", "/v1/tasks/bulk", bulk_create, "Create many tasks (up to [api] max_bulk)",
      {200: "BulkCreated"}, body="BulkCreate"),
    # Actions over selected tasks (before {task_id}: "actions" is no task id here).
    E("POST", "/v1/tasks/actions", tasks_action,
      "Pause, resume, stop, trigger, delete or backfill every task a selector matches "
      "(dry_run: count them); resumable, never twice", {200: "TasksActed"}, body="TasksAction",
      problems=(409,)),
    E("GET", "/v1/tasks/actions/{action_id}", action_status,
      "An action's state and progress", {200: "ActionState"}, problems=(404,)),
    E("GET", "/v1/tasks/{task_id}", get_task, "One task", {200: "Task"}, problems=(404,)),
    E("PATCH", "/v1/tasks/{task_id}", update_task, "Replace payload, schedule and/or labels",
      {200: "TaskStatus"}, body="TaskUpdate", problems=(404, 409)),
    E("DELETE", "/v1/tasks/{task_id}", delete_task, "Delete a task", {200: "Deleted"},
      problems=(404,)),
    *(
        E("POST", f"/v1/tasks/{{task_id}}/{action}", transition(action),
          f"{action.capitalize()} a task (an optional note says why)", {200: "TaskStatus"},
          body="NoteBody", body_optional=True, problems=(404, 409))
        for action in ("pause", "resume")
    ),
    E("POST", "/v1/tasks/{task_id}/stop", transition("stop"), "Stop a task",
      {200: "TaskStatus"}, problems=(404, 409)),
    E("POST", "/v1/tasks/{task_id}/trigger", trigger_task,
      "Run a task now, once, outside its schedule (not a stopped one)", {202: "Triggered"},
      body="TriggerBody", body_optional=True, problems=(404, 409)),
    E("POST", "/v1/tasks/{task_id}/backfill", backfill_task,
      "Run the task's grid times of a past window, each once however often repeated",
      {200: "TaskBackfilled"}, body="TaskBackfill", problems=(404, 409)),
    E("POST", "/v1/backfill", backfill_type,
      "Backfill a past window of every active or paused task of a type", {200: "TypeBackfilled"},
      body="TypeBackfill"),
    E("GET", "/v1/tasks/{task_id}/explain", explain_task, "Why this task is or is not running",
      {200: "Explanation"}, problems=(404,)),
    E("GET", "/v1/tasks/{task_id}/upcoming", upcoming_fires,
      "The task's next fires: grid time and when the poller enqueues each (jitter aside)",
      {200: "Upcoming"}, query=("n",), problems=(404,)),
    E("GET", "/v1/tasks/{task_id}/history", history,
      "The task's last occurrences, newest first: each grid time's or manual fire's fate",
      {200: "History"}, query=("limit",), problems=(404,)),
    E("POST", "/v1/tasks/{task_id}/acknowledge", acknowledge_task,
      "Take the task off the attention list (an optional note says why)",
      {200: "Acknowledged"}, body="NoteBody", body_optional=True, problems=(404,)),
    E("GET", "/v1/attention", attention,
      "Tasks whose latest occurrence needs an operator: dead, expired, skipped or late",
      {200: "AttentionPage"}, query=("type", "reason", "cursor", "limit")),
    E("POST", "/v1/types/{type}/clear", clear_type,
      "Delete every task of a type (confirm must repeat the type)", {200: "Cleared"},
      body="Clear"),
    E("GET", "/v1/queues", queues, "Backlog of every type", {200: "Queues"}),
    E("GET", "/v1/queues/{type}", queue, "Backlog of one type", {200: "Queue"}),
    E("POST", "/v1/queues/{type}/purge", purge_queue,
      "Delete the type's undelivered messages (confirm must repeat the type)", {200: "Purged"},
      body="Clear"),
    E("GET", "/v1/dlq/{type}", list_dead, "Dead letters of a type, newest first",
      {200: "DeadLetterPage"}, query=("before", "limit")),
    E("POST", "/v1/dlq/{type}/replay", replay_dead,
      "Move dead letters back to the queue as first attempts", {200: "Replayed"},
      body="Entries"),
    E("POST", "/v1/dlq/{type}/purge", purge_dead,
      "Delete dead letters (all needs confirm = the type)", {200: "Purged"}, body="Entries"),
    E("GET", "/v1/dlq/{type}/{entry_id}", show_dead, "One dead letter", {200: "DeadLetter"},
      problems=(404,)),
    E("GET", "/v1/nodes", nodes,
      "Every process of the namespace's nodes: its actors (up, down and why) and restarts",
      {200: "Nodes"}),
    E("GET", "/v1/partitions", partitions,
      "Which poller serves each partition, until when, and how many of its tasks are due",
      {200: "Partitions"}),
    E("GET", "/v1/whoami", whoami, "The key that signed this request, and whether it may write",
      {200: "WhoAmI"}),
]  # fmt: skip


async def to_dashboard(_request: Request) -> Response:
    return RedirectResponse("/dashboard/")


def build_app(services: ApiServices) -> ASGIApp:
    """The API as an ASGI app: the routes, the dashboard, the security headers on every
    answer (``SecurityHeaders``), and the rest of a body an answer left unread read and
    dropped after it (``ReadUnreadBody``)."""
    document = openapi_document(ROUTES, {**BACKFILL_SCHEMAS, **ACTION_SCHEMAS, **LEDGER_SCHEMAS})

    async def serve_openapi(_request: Request) -> Response:
        return JSONResponse(document)

    routes: list[BaseRoute] = [
        Route(e.path, endpoint_for(services, e), methods=[e.method]) for e in ROUTES
    ]
    routes.append(Route("/openapi.json", serve_openapi, methods=["GET"]))
    # Prometheus text, not JSON: outside the table and the OpenAPI document; unsigned, for
    # the scrapers [metrics] allow and token_env let in (docs/OBSERVABILITY.md).
    scrape = E("GET", "/metrics", metrics, "Prometheus metrics", {200: ""}, public=True)
    routes.append(Route("/metrics", endpoint_for(services, scrape), methods=["GET"]))
    # The dashboard: static files shipped in the package; it signs its /v1 calls itself.
    routes.append(Mount("/dashboard", StaticFiles(directory=DASHBOARD, html=True)))
    routes.append(Route("/", to_dashboard, methods=["GET"]))

    async def not_found(_request: Request, _exc: Exception) -> Response:
        return Problem(404, "no_route", "no such endpoint; see /openapi.json").response()

    async def not_allowed(_request: Request, _exc: Exception) -> Response:
        return Problem(405, "method_not_allowed", "method not allowed on this path").response()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    return SecurityHeaders(ReadUnreadBody(app, 2 * services.settings.max_body_bytes))
