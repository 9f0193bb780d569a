"""The action endpoints: act on every task a selector matches (``POST /v1/tasks/actions``)
and an action's state (``GET /v1/tasks/actions/{action_id}``). The store does the work
(``actors.store.actions``, ``actors.store.apply_actions``); these check the body, answer
a dry run, and record and apply the action under this request's lease.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, get_args

from starlette.responses import Response

from actors.api import bodies
from actors.api import openapi_parts as oa
from actors.api.problems import Problem, invalid
from actors.api.routes import Call, ok
from actors.api.selectors import body_selector
from actors.domain.errors import InvalidTask
from actors.domain.schedules import Overlap
from actors.store.actions import (
    ACTIONS,
    DONE,
    ActionSpec,
    ActionState,
    create_action,
    read_action,
    take_lease,
    unreadable_action,
)
from actors.store.apply_actions import LeaseLost, apply_action, plan_backfill
from actors.store.history import FATE_NAMES
from actors.store.selection import count_matches
from runtime.liveness import holder_is_gone, owner_value

BODY_KEYS = ("selector", "action", "note", "overlap", "start_ms", "end_ms", "dry_run",
             "action_id", "all")  # fmt: skip


def _spec(data: dict[str, Any]) -> ActionSpec:
    unknown = sorted(set(data) - set(BODY_KEYS))
    if unknown:
        known = ", ".join(BODY_KEYS)
        raise invalid("; ".join(f"{k}: unknown key (known keys: {known})" for k in unknown))
    if "selector" not in data or "action" not in data:
        raise invalid("selector: give a selector and an action")
    selector = body_selector(data["selector"], data.get("all", False))
    try:
        return ActionSpec(
            data["action"], selector, data.get("note"), data.get("overlap"),
            data.get("start_ms"), data.get("end_ms"),
        )  # fmt: skip
    except InvalidTask as exc:
        raise invalid(str(exc)) from None


def _answer(state: ActionState) -> dict[str, Any]:
    return {"action_id": state.action_id, "dry_run": False, **state.counts(),
            "done": state.state == DONE}  # fmt: skip


async def tasks_action(call: Call) -> Response:
    data = bodies.json_object(call.body)
    spec = _spec(data)
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise invalid("dry_run: must be true or false")
    given = data.get("action_id")
    if given is not None and not isinstance(given, str):
        raise invalid("action_id: must be a string")
    action_id = bodies.name_param("action_id", given) if given is not None else None
    store, settings = call.store, call.services.actions
    if spec.action == "backfill":  # a dry run says what the call would: refused, or not
        await plan_backfill(store, spec, settings.backfill_max_fires)
    if dry_run:
        count, sample = await count_matches(store, spec.selector)
        return ok({"action_id": None, "dry_run": True, "count": count, "sample": sample})
    action_id = action_id or f"act-{secrets.token_hex(8)}"
    holder = owner_value()
    existing = await create_action(store, action_id, spec, call.key_id, holder, settings.lease_ms)
    if existing is not None:
        if _stored_spec(action_id, existing) != spec.to_dict():
            detail = f"action {action_id!r} exists with another action or selector"
            raise Problem(409, "conflict", detail)
        state = await read_action(store, action_id)
        if state is None or state.state == DONE:
            return ok(_answer(state)) if state is not None else _gone(action_id)
        gone = state.holder if holder_is_gone(state.holder, this_process_is_gone=False) else ""
        if not await take_lease(store, action_id, holder, settings.lease_ms, gone):
            raise _elsewhere(action_id)
    try:
        state = await apply_action(store, action_id, holder, settings)
    except LeaseLost:
        raise _elsewhere(action_id) from None
    return ok(_answer(state))


def _elsewhere(action_id: str) -> Problem:
    return Problem(
        409, "in_progress",
        f"action {action_id!r} is being applied by another node; GET "
        f"/v1/tasks/actions/{action_id} shows its progress",
    )  # fmt: skip


def _gone(action_id: str) -> Response:
    raise Problem(404, "not_found", f"action {action_id!r} not found")


async def action_status(call: Call) -> Response:
    action_id = bodies.name_param("action_id", call.path("action_id"))
    state = await read_action(call.store, action_id)
    if state is None:
        raise Problem(404, "not_found", f"action {action_id!r} not found")
    return ok(state.to_dict())


_FAILED = {"type": "array", "items": oa._obj(["task_id", "reason"],
                                             {"task_id": oa._STR, "reason": oa._STR})}  # fmt: skip
_COUNTS = {
    "count": {**oa._INT, "description": "tasks matched when their partition was applied"},
    "changed": oa._INT,
    "unchanged": oa._INT,
    "failed": {**_FAILED, "description": "the first 100 tasks the action could not change"},
    "failed_count": oa._INT,
}
_SELECTOR = oa._obj(
    [],
    {
        "type": oa._NAME,
        "status": oa._STATUS,
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "next_before": {"type": "integer", "minimum": 0, "maximum": 10**15},
        "last_status": {"enum": ["ok", "retry", "dead"]},
        "last_fate": {"enum": list(FATE_NAMES)},
        "ids": {"type": "array", "items": oa._TASK_ID},
        "all": oa._BOOL,
    },
)
_ARGS = {
    "action": {"enum": list(ACTIONS)},
    "note": {**oa._STR, "description": "pause, resume: kept with each task changed"},
    "overlap": {"enum": list(get_args(Overlap)), "description": "trigger, backfill"},
    "start_ms": {**oa._INT, "description": "backfill: window start, Unix ms"},
    "end_ms": {**oa._INT, "description": "backfill: window end, Unix ms (exclusive)"},
}

#: The bodies and answers of these endpoints in the OpenAPI document.
SCHEMAS: dict[str, Any] = {
    "Selector": _SELECTOR,
    "TasksAction": oa._obj(
        ["selector", "action"],
        {
            "selector": oa._ref("Selector"),
            **_ARGS,
            "dry_run": {**oa._BOOL, "description": "write nothing: count and sample"},
            "action_id": {**oa._NAME, "description": "yours: a repeat continues, never twice"},
            "all": {**oa._BOOL, "description": "an empty selector means every task"},
        },
    ),
    "TasksActed": oa._obj(
        ["action_id", "dry_run", "count"],
        {
            "action_id": oa._nullable(oa._STR),
            "dry_run": oa._BOOL,
            "sample": {"type": "array", "items": oa._STR},
            **_COUNTS,
            "done": oa._BOOL,
        },
    ),
    "ActionState": oa._obj(
        ["action_id", "action", "selector", "state", "done", "created_ms", "partitions",
         "partitions_done", *_COUNTS],
        {
            "action_id": oa._STR,
            **_ARGS,
            "selector": oa._ref("Selector"),
            "key_id": oa._nullable(oa._STR),
            "state": {"enum": ["applying", "done"]},
            "done": oa._BOOL,
            "created_ms": oa._INT,
            "done_ms": oa._nullable(oa._INT),
            "lease_until_ms": oa._nullable(oa._INT),
            "partitions": oa._INT,
            "partitions_done": oa._INT,
            **_COUNTS,
        },
    ),
}  # fmt: skip


def _stored_spec(action_id: str, text: str) -> Any:
    """The spec an action of this id was recorded with, as JSON; RecordError when it is
    not JSON (another program's record): said as such, not as a conflict."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past its depth
        raise unreadable_action(action_id, exc) from exc
