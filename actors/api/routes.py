"""The API's endpoints: each checks its input, calls the store, queues or explain, and
answers JSON. ``endpoint_for`` (used by ``actors.api.app.build_app``) wraps every endpoint
in the same steps, in this order:

1. refuse a body over ``max_body_bytes`` (413), and a signed endpoint's request whose
   signature headers are missing or malformed or whose timestamp is out of the window
   (401), before reading it (what the client still sends of it is read and dropped after
   the answer: ``actors.api.unread_body``); then read it whole within ``BODY_READ_S`` (408);
2. verify the request's signature and nonce (``actors.api.signing``; 401/403) — every ``/v1``
   endpoint, reads included; only ``/healthz``, ``/readyz``, ``/metrics`` and
   ``/openapi.json`` are open (``/metrics`` to whom ``[metrics] allow`` and ``token_env``
   let in, or to a signed request; ``/readyz`` names the actors that are down only to a
   signed request);
3. run the endpoint; a typed error becomes its problem details (``problems``), anything
   else a 500 that is logged with its traceback and reveals nothing.

Nothing is written before steps 1-2 pass and the whole input is valid. A refused signature
is logged with the real reason (``refused``), which the client is not always told
(``AuthError.answer``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import structlog
import trio
from starlette.requests import Request
from starlette.responses import Response

from actors.api import bodies
from actors.api.answers import JsonAnswer
from actors.api.endpoint import Endpoint
from actors.api.explain import explain
from actors.api.problems import Problem, from_exception, invalid
from actors.api.queues import Queues
from actors.api.selectors import query_filter
from actors.api.signing import KEY_HEADER, AuthError, Verifier
from actors.api.task_notes import note_of, note_param
from actors.config import ApiSection
from actors.domain.api_keys import ApiKey
from actors.domain.labels import check_labels
from actors.domain.model import TaskSpec, parse_schedule, parse_spec, parse_specs
from actors.domain.schedules import Schedule, check_submitted
from actors.observability.endpoint import ScrapeGate, metrics_response
from actors.observability.partitions import read_partitions
from actors.observability.presence import read_nodes
from actors.observability.redis_gauges import RedisGauges
from actors.store.apply_actions import ActionSettings
from actors.store.records import RecordError
from actors.store.tasks import KEEP, TaskStore
from runtime.errors import RedisUnavailable
from runtime.health import Health
from runtime.logging import emit_events
from runtime.version import __version__

#: The API actor's path in the tree (its lines carry it as ``actor``).
API_ACTOR = "node/api"

Handler = Callable[["Call"], Awaitable[Response]]


@attrs.frozen
class ApiServices:
    """What the endpoints need, built once per API actor start."""

    store: TaskStore
    queues: Queues
    verifier: Verifier
    settings: ApiSection
    health: Health
    gauges: RedisGauges
    scrape: ScrapeGate
    """Who may read ``/metrics`` unsigned (``[metrics] allow``, ``token_env``)."""
    log: Any = attrs.field(factory=lambda: structlog.get_logger().bind(actor=API_ACTOR))
    actions: ActionSettings = attrs.field(factory=ActionSettings)
    """How actions over selected tasks are applied (``[actions]``, ``[api] backfill_*``)."""


@attrs.frozen
class Call:
    """One authenticated request, as an endpoint sees it."""

    request: Request
    body: bytes
    services: ApiServices
    key_id: str | None

    @property
    def store(self) -> TaskStore:
        return self.services.store

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])


def ok(data: Any, status: int = 200) -> Response:
    return JsonAnswer(data, status)


# -- tasks ------------------------------------------------------------------------------


def _submitted(call: Call, schedule: Schedule, where: str = "") -> list[str]:
    """This node's rules for a schedule a client submits (``check_submitted``)."""
    try:
        check_submitted(schedule, call.services.settings.min_interval_s)
    except ValueError as exc:
        return [f"{where}{exc}"]
    return []


def _check_spec(call: Call, spec: TaskSpec, where: str = "") -> list[str]:
    problems = _submitted(call, spec.schedule, where)
    declared = call.services.settings.task_types
    if declared and spec.type not in declared:
        problems.append(
            f"{where}type: unknown task type {spec.type!r}; this namespace declares: "
            + ", ".join(declared)
        )
    return problems


async def _stored_as_given(call: Call, spec: TaskSpec) -> bool:
    """Whether ``spec`` names a task stored with this very definition: created again, it
    is answered as existing (200, ``created: false``) even where this version's rules
    for new schedules refuse it (a task an earlier version stored: a deploy script that
    creates its tasks at every run must not start failing)."""
    if spec.task_id is None:
        return False
    try:
        task = await call.store.get(spec.task_id)
    except RecordError:
        return False
    stored = spec.schedule.for_task(spec.task_id)  # H fields resolved, as create stores it
    return task is not None and (task.type, task.payload, task.schedule, task.labels) == (
        spec.type, spec.payload, stored, spec.labels
    )  # fmt: skip


async def create_task(call: Call) -> Response:
    spec = parse_spec(bodies.json_body(call.body))
    problems = _check_spec(call, spec)
    if problems and not await _stored_as_given(call, spec):
        raise invalid("; ".join(problems))
    created = await call.store.create(spec)
    return ok(
        {"task_id": created.task_id, "created": created.created}, 201 if created.created else 200
    )


async def bulk_create(call: Call) -> Response:
    data = bodies.json_object(call.body)
    unknown = sorted(set(data) - {"tasks"})
    if unknown or not isinstance(data.get("tasks"), list):
        raise invalid('tasks: the body must be {"tasks": [task, ...]} and nothing else')
    items = data["tasks"]
    limit = call.services.settings.max_bulk
    if not 1 <= len(items) <= limit:
        raise invalid(f"tasks: give 1-{limit} tasks per request, got {len(items)}")
    specs, problems = parse_specs(items)
    problems = [f"tasks{p}" for p in problems]
    first_index: dict[str, int] = {}
    for i, spec in enumerate(specs if not problems else []):
        refused = _check_spec(call, spec, f"tasks[{i}].")
        if refused and not await _stored_as_given(call, spec):
            problems += refused
        if spec.task_id is None:
            continue
        if spec.task_id in first_index:
            problems.append(
                f"tasks[{i}].task_id: {spec.task_id!r} already appears at "
                f"tasks[{first_index[spec.task_id]}] (an id may appear once per bulk create)"
            )
        first_index.setdefault(spec.task_id, i)
    if problems:
        raise invalid("; ".join(problems[:100]))
    created = await call.store.create_many(specs, raise_conflicts=False)
    results = [
        {"task_id": c.task_id, "created": c.created, "conflict": c.conflict} for c in created
    ]
    return ok(
        {
            "created": sum(c.created for c in created),
            "existing": sum(not c.created and not c.conflict for c in created),
            "conflicts": sum(c.conflict for c in created),
            "results": results,
        }
    )


async def list_tasks(call: Call) -> Response:
    query = call.request.query_params
    wanted = query_filter(query)  # the same filters an action's selector takes
    unreadable: list[tuple[str, str]] = []
    tasks, cursor = await call.store.list_tasks(
        wanted.task_type, wanted.status, query.get("cursor"), bodies.limit_param(query, 100),
        labels=wanted.labels, next_before=wanted.next_before, last_status=wanted.last_status,
        last_fate=wanted.last_fate, unreadable=unreadable,
    )  # fmt: skip
    page: dict[str, Any] = {"tasks": [t.to_dict() for t in tasks], "next_cursor": cursor}
    if unreadable:  # listed past, named: one broken record does not hide the others
        page["unreadable"] = [{"task_id": t, "error": why} for t, why in unreadable]
    return ok(page)


async def get_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    task = await call.store.get(task_id)
    if task is None:
        raise Problem(404, "not_found", f"task {task_id!r} not found")
    return ok({**task.to_dict(), "note": await note_of(call.store, task_id)})


async def update_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    data = bodies.json_object(call.body)
    unknown = sorted(set(data) - {"payload", "schedule", "labels"})
    if unknown:
        raise invalid(
            "; ".join(f"{k}: unknown key (known keys: payload, schedule, labels)" for k in unknown)
        )
    if not data:
        raise invalid("body: give payload, schedule and/or labels")
    labels = check_labels(data["labels"]) if "labels" in data else None
    schedule = parse_schedule(data["schedule"]) if "schedule" in data else None
    problems = _submitted(call, schedule) if schedule is not None else []
    if problems and schedule is not None:
        # The task's own schedule sent again (a client that sends the whole task to change
        # its payload) stays accepted under a rule made since it was stored.
        task = await call.store.get(task_id)
        if task is not None and task.schedule == schedule.for_task(task_id):
            problems = []
    if problems:
        raise invalid("; ".join(problems))
    status = await call.store.update(
        task_id, payload=data.get("payload", KEEP), schedule=schedule, labels=labels
    )
    return ok({"task_id": task_id, "status": status})


def transition(action: str) -> Handler:
    async def endpoint(call: Call) -> Response:
        task_id = bodies.task_id_param(call.path("task_id"))
        if action == "stop":
            if call.body.strip() and bodies.json_object(call.body):
                raise invalid("body: a stop takes none (only a pause or a resume keeps a note)")
            status = await call.store.stop(task_id)
        else:  # pause and resume keep a note, if the body gives one
            status = await getattr(call.store, action)(task_id, note_param(call.body), call.key_id)
        return ok({"task_id": task_id, "status": status})

    return endpoint


async def trigger_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    overlap = bodies.overlap_param(call.body)
    schedule_id, queued = await call.store.trigger(task_id, overlap)
    return ok({"task_id": task_id, "schedule_id": schedule_id, "queued": queued}, 202)


async def delete_task(call: Call) -> Response:
    task_id = bodies.task_id_param(call.path("task_id"))
    if not await call.store.delete(task_id):
        raise Problem(404, "not_found", f"task {task_id!r} not found")
    return ok({"task_id": task_id, "deleted": True})


async def explain_task(call: Call) -> Response:
    return ok(await explain(call.store, bodies.task_id_param(call.path("task_id"))))


async def clear_type(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    body = bodies.structure(call.body, bodies.ClearBody)
    if body.confirm != task_type:
        raise invalid(f"confirm: must repeat the type {task_type!r} to clear it")
    return ok({"type": task_type, "deleted": await call.store.clear_type(task_type)})


# -- probes -----------------------------------------------------------------------------


async def healthz(call: Call) -> Response:
    """200 for anyone while the process serves, with the version it runs."""
    return ok({"status": "ok", "version": __version__})


async def readyz(call: Call) -> Response:
    """200 or 503 for anyone (a probe signs nothing), with the version it runs (as
    ``/healthz``: a rollout can watch one probe); which actors are down (their paths are
    the node's layout) only for a signed request."""
    down = call.services.health.down()
    try:
        redis_ok = await call.store.client.ping()
    except Exception:
        redis_ok = False
    # Redis answering PING may still refuse writes (OOM, MISCONF): not ready while this
    # process's steps are being refused (runtime.redis_replies).
    refusing = call.store.client.refusing
    ready = redis_ok and not down and refusing is None
    answer: dict[str, Any] = {"ready": ready, "redis": redis_ok, "version": __version__}
    if refusing is not None:
        answer["redis_refusing"] = refusing
    # Without Redis no signature can be checked (its clock and nonces live there).
    if redis_ok and await _signed_key(call) is not None:
        answer["actors_down"] = down
    return ok(answer, 200 if ready else 503)


async def _signed_key(call: Call) -> ApiKey | None:
    """The key that signed this request to an open endpoint, or None: unsigned, or a
    signature refused (logged; the endpoint then answers as to anyone)."""
    if KEY_HEADER.lower() not in call.request.headers:
        return None
    request = call.request
    try:
        return await call.services.verifier.verify(
            request.method, _path_with_query(request), dict(request.headers), call.body
        )
    except (AuthError, RedisUnavailable) as exc:
        call.services.log.info(
            "api_request", method=request.method, path=request.url.path, key=None,
            refused=str(exc), claimed_key=request.headers.get(KEY_HEADER, "")[:64],
        )  # fmt: skip
        return None


async def whoami(call: Call) -> Response:
    key = call.services.verifier.keys[call.key_id or ""]
    return ok({"key_id": key.key_id, "read_only": key.read_only})


async def nodes(call: Call) -> Response:
    return ok({"now_ms": await call.store.now_ms(), "processes": await read_nodes(call.store)})


async def partitions(call: Call) -> Response:
    return ok(await read_partitions(call.store))


async def metrics(call: Call) -> Response:
    """For a scraper ``[metrics] allow`` and ``token_env`` let in, or for a signed request
    (the dashboard's rates: an operator's key passes wherever the browser is)."""
    if await _signed_key(call) is None:
        refusal = call.services.scrape.refusal(call.request)
        if refusal is not None:
            return refusal
    return await metrics_response(call.services.gauges)


# -- the app ----------------------------------------------------------------------------


#: How long a request's body may take to arrive whole: a client that sends it slowly, or
#: never finishes, does not hold the buffer (up to ``[api] max_body_bytes``) for longer.
BODY_READ_S = 30.0


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (413) and within ``BODY_READ_S`` (408)."""
    with trio.move_on_after(BODY_READ_S):
        return await _read_body_whole(request, limit)
    raise Problem(408, "body_timeout", f"the body did not arrive whole within {BODY_READ_S:g} s")


def _refuse_declared_too_large(request: Request, limit: int) -> None:
    """413 for a declared length over ``limit``: refused before anything else is read."""
    declared = request.headers.get("content-length")
    if declared is not None and (
        not (declared.isascii() and declared.isdecimal() and len(declared) <= 18)
        or int(declared) > limit
    ):
        raise Problem(413, "too_large", f"the body may be at most {limit} bytes")


async def _read_body_whole(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, "too_large", f"the body may be at most {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _path_with_query(request: Request) -> str:
    """Exactly what the client sent on the request line: that is what it signed."""
    path = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    return (path + (b"?" + query if query else b"")).decode("latin-1")


def endpoint_for(services: ApiServices, route: Endpoint) -> Any:
    handler, public, allowed = route.handler, route.public, set(route.query)

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        key_id, refusal = None, None
        try:
            _refuse_declared_too_large(request, services.settings.max_body_bytes)
            if not public:  # no body is read for a request whose headers cannot pass
                await services.verifier.precheck(dict(request.headers))
            body = await _read_body(request, services.settings.max_body_bytes)
            if not public:
                key = await services.verifier.verify(
                    request.method, _path_with_query(request), dict(request.headers), body
                )
                key_id = key.key_id
                bodies.only_keys(request.query_params, allowed)
            response: Response = await handler(Call(request, body, services, key_id))
        except Exception as exc:
            refusal = str(exc) if isinstance(exc, AuthError) else None  # the real reason
            problem = from_exception(exc)
            if problem is None:
                services.log.error("api_error", method=request.method, path=request.url.path,
                                   exc_info=exc)  # fmt: skip
                problem = Problem(500, "internal", "an internal error occurred; see the node log")
            response = problem.response()
        if not public:
            fields = {
                "method": request.method,
                "path": request.url.path,
                "status": response.status_code,
                "key": key_id,
                "ms": round((time.perf_counter() - started) * 1000, 2),
            }
            if refusal is not None:  # at info for reads too: an operator wants to see these
                fields["refused"] = refusal
                fields["claimed_key"] = request.headers.get(KEY_HEADER, "")[:64]
                services.log.info("api_request", **fields)
            elif request.method in ("GET", "HEAD"):
                services.log.debug("api_request", **fields)
            else:  # writes come by the thousand per second: the lifecycle lines' fast path
                emit_events(API_ACTOR, [("api_request", fields)])
        return response

    return endpoint
