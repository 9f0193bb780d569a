"""A task's upcoming fires: ``GET /v1/tasks/{task_id}/upcoming?n=10``, and the next three
in ``explain``.

The fires come from ``actors.domain.preview.upcoming``, which replays the poller's own
steps from the task's stored next grid time, fires already made and Redis's clock: what it
lists is what will run, unless the task is changed, paused or stopped meanwhile. Only the
random jitter is left out (it is drawn per fire when the poller commits the one before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from actors.api import bodies
from actors.api.answers import JsonAnswer
from actors.api.problems import Problem, invalid
from actors.api.task_notes import parked_on
from actors.domain.model import Task
from actors.domain.preview import MAX_PREVIEW, rows, upcoming
from actors.store.flights import parse_policy, task_policy_code

if TYPE_CHECKING:
    from actors.api.routes import Call

#: Fires listed when ``n`` is not given.
DEFAULT_UPCOMING = 10

_NOT_ACTIVE = {
    "paused": "paused: no fires until resumed; resuming places the next fire at the first "
    "grid time after the resume",
    "stopped": "stopped: it never fires again",
    "finished": "finished: its schedule has no further fires",
}


def task_upcoming(task: Task, n: int, now_ms: int, parked_ms: int | None = None) -> dict[str, Any]:
    """The answer for one task: its next ``n`` fires (none unless it is active) and notes
    on what the list leaves out. ``parked_ms``: the time the task is parked on
    (``parked_on``), which is no fire to come."""
    schedule = task.schedule
    notes: list[str] = []
    fires: list[dict[str, Any]] = []
    if task.status != "active":
        notes.append(_NOT_ACTIVE[task.status])
    else:
        policy = parse_policy(task_policy_code(schedule, task.task_id))
        planned = upcoming(
            schedule, task.next_run_ms, n, task.task_id, fires_so_far=task.fires,
            now_ms=now_ms, decided_ms=parked_ms if parked_ms == task.next_run_ms else None,
            expires=policy.expired if policy.window_ms is not None else None,
        )  # fmt: skip
        fires = rows(schedule, planned)
        if len(planned) < n:
            notes.append(f"its schedule ends after {len(planned)} more fire(s)")
        if schedule.jitter_s:
            notes.append(
                f"each fire is also delayed by a random jitter of up to {schedule.jitter_s:g}s, "
                "not included in fire_ms"
            )
    return {
        "task_id": task.task_id,
        "status": task.status,
        "now_ms": now_ms,
        "tz": schedule.tz,
        "offset_ms": schedule.offset_ms(task.task_id),
        "fires": fires,
        "notes": notes,
    }


def count_param(query: Any, name: str = "n") -> int:
    raw = query.get(name)
    if raw is None:
        return DEFAULT_UPCOMING
    if (
        not (raw.isascii() and raw.isdecimal() and len(raw) <= 9)
        or not 1 <= int(raw) <= MAX_PREVIEW
    ):
        raise invalid(f"{name}: must be an integer within 1..{MAX_PREVIEW}, got {raw!r}")
    return int(raw)


async def upcoming_fires(call: Call) -> Response:
    """``GET /v1/tasks/{task_id}/upcoming``."""
    task_id = bodies.task_id_param(call.path("task_id"))
    n = count_param(call.request.query_params)
    task = await call.store.get(task_id)
    if task is None:
        raise Problem(404, "not_found", f"task {task_id!r} not found")
    parked = await parked_on(call.store, task_id)
    return JsonAnswer(task_upcoming(task, n, await call.store.now_ms(), parked))
