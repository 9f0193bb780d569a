"""The queue and dead-letter endpoints: a type's backlog, purging it, and listing,
showing, replaying and purging its dead letters (``actors.api.queues`` does the work;
``actors.api.routes`` wraps every endpoint in the same steps)."""

from __future__ import annotations

from starlette.responses import Response

from actors.api import bodies
from actors.api.problems import Problem, invalid
from actors.api.queues import tally
from actors.api.routes import Call, ok


async def queues(call: Call) -> Response:
    return ok(await call.services.queues.stats())


async def queue(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    stats = await call.services.queues.stats([task_type])
    return ok({"now_ms": stats["now_ms"], **stats["queues"][0]})


async def purge_queue(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    body = bodies.structure(call.body, bodies.ClearBody)
    if body.confirm != task_type:
        raise invalid(f"confirm: must repeat the type {task_type!r} to purge its queue")
    return ok({"type": task_type, "purged": await call.services.queues.purge_queue(task_type)})


async def list_dead(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    query = call.request.query_params
    before = query.get("before")
    if before is not None:
        before = bodies.entry_id_param(before, "before")
    page, cursor = await call.services.queues.dead_letters(
        task_type, before, bodies.limit_param(query, 50)
    )
    return ok({"dead_letters": [d.to_dict() for d in page], "next_cursor": cursor})


async def show_dead(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    entry_id = bodies.entry_id_param(call.path("entry_id"))
    entry = await call.services.queues.dead_letter(task_type, entry_id)
    if entry is None:
        raise Problem(404, "not_found", f"no dead letter {entry_id} of type {task_type!r}")
    return ok(entry.to_dict())


async def replay_dead(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    body = bodies.structure(call.body, bodies.EntriesBody)
    if body.all:
        return ok({"type": task_type, **await call.services.queues.replay_all(task_type)})
    results = await call.services.queues.replay(task_type, body.entry_ids or [])
    return ok({"type": task_type, **tally(results), "results": results})


async def purge_dead(call: Call) -> Response:
    task_type = bodies.name_param("type", call.path("type"))
    body = bodies.structure(call.body, bodies.EntriesBody)
    if body.all and body.confirm != task_type:
        raise invalid(f"confirm: must repeat the type {task_type!r} to purge its whole DLQ")
    purged = await call.services.queues.purge(task_type, None if body.all else body.entry_ids)
    return ok({"type": task_type, "purged": purged})
