"""Errors as RFC 9457 problem details (``application/problem+json``).

Every refusal the API makes is a ``Problem``: a status, a stable ``code`` (also the last
part of ``type``) scripts can branch on, a human ``detail``, and for validation errors an
``errors`` list naming each field. ``from_exception`` is the one table from the store's
typed errors to HTTP statuses; anything not in it is a 500 that reveals nothing.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import redis
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from actors.api.signing import AuthError
from actors.domain.errors import (
    InvalidTask,
    InvalidTransition,
    LayoutMismatch,
    TaskConflict,
    TaskNotFound,
)
from actors.store.records import RecordError
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.redis_replies import rejected_alone, reply_text

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:metronome:problem:"

_TITLES = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Invalid input",
    500: "Internal error",
    503: "Unavailable",
}


@attrs.frozen
class Problem(Exception):
    status: int
    code: str
    detail: str
    errors: list[dict[str, str]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": TYPE_PREFIX + self.code,
            "title": _TITLES.get(self.status, "Error"),
            "status": self.status,
            "code": self.code,
            "detail": self.detail,
        }
        if self.errors is not None:
            out["errors"] = self.errors
        return out

    def response(self) -> Response:
        headers = {"WWW-Authenticate": "Metronome-HMAC"} if self.status == 401 else None
        return Response(
            json.dumps(self.to_dict()), self.status, headers=headers, media_type=MEDIA_TYPE
        )


#: A field as problems name one: a key path (``schedule.cron``, ``tasks[3].task_id``,
#: ``labels.team-a``), never words, quotes or brackets of a message.
_KEY_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-\[\]]*")


def _parts(detail: str) -> list[str]:
    """``detail`` split at each ``"; "`` outside quotes: a value quoted in a message (a
    client's id, ``'a; b: c'``) is never taken for another field's problem."""
    parts, start, quote = [], 0, ""
    for i, c in enumerate(detail):
        if quote:
            if c == quote and detail[i - 1] != "\\":
                quote = ""
        elif c in "'\"" and (i == 0 or detail[i - 1] in " ([{=,"):  # not "task's"
            quote = c
        elif c == ";" and detail.startswith("; ", i):
            parts.append(detail[start:i])
            start = i + 2
    return [*parts, detail[start:]]


def invalid(detail: str) -> Problem:
    """A 422 whose ``errors`` split ``detail`` (``field: message; ...``) by field; a part
    whose head is no key path is a message of no field."""
    errors = []
    for part in _parts(detail):
        field, sep, message = part.partition(": ")
        if not sep or not _KEY_PATH.fullmatch(field):
            field, message = "", part
        inner, sep, rest = message.partition(": ")
        if sep and inner.startswith(f"{field}."):  # "schedule: schedule.cron: ..." nests
            field, message = inner, rest
        errors.append({"field": field, "message": message})
    text = "; ".join(
        f"{e['field']}: {e['message']}" if e["field"] else e["message"] for e in errors
    )
    return Problem(422, "invalid", text, errors)


def from_exception(exc: Exception) -> Problem | None:
    """The problem a known error means, or None for an unexpected one (a bug: 500)."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, AuthError):
        return Problem(exc.status, *exc.answer)  # an unknown key reads as a bad signature
    if isinstance(exc, ClientDisconnect):  # gone before its body was whole: no one to tell
        return Problem(400, "client_disconnected", "the client left before its body was read")
    if isinstance(exc, InvalidTask):
        return invalid(str(exc))
    if isinstance(exc, TaskNotFound):
        return Problem(404, "not_found", str(exc))
    if isinstance(exc, TaskConflict):
        return Problem(409, "conflict", str(exc))
    if isinstance(exc, InvalidTransition):
        return Problem(409, "invalid_transition", str(exc))
    if _no_permission(exc):
        return Problem(
            503,
            "redis_permission",
            "Redis refused a command: the node's ACL user lacks a permission "
            "(deploy/redis/users.acl lists what Metronome needs)",
        )
    if isinstance(exc, RedisRefused):
        return Problem(503, "redis_refused", f"Redis refused the command ({exc.kind}); {exc.fix}")
    if isinstance(exc, RedisUnavailable):
        return Problem(503, "redis_unavailable", "Redis is unreachable; retry later")
    if isinstance(exc, LayoutMismatch):
        return Problem(503, "layout_mismatch", str(exc))
    if isinstance(exc, RecordError):  # the data, not the request
        return Problem(
            500,
            "unreadable_record",
            f"a stored record cannot be read ({exc}): written by another program or a "
            "version this one does not read; mend or delete it",
        )
    if rejected_alone(exc):  # the data, not the request: a key of another kind, say
        return Problem(
            500,
            "redis_rejected",
            f"Redis rejected a command ({reply_text(exc)}): a key in the namespace holds "
            "data of another kind, or a record no script can read; remove or mend it",
        )
    return None


def _no_permission(exc: Exception) -> bool:
    """Redis's NOPERM, also from inside a script (a plain ResponseError there), and
    the node's classification of it (``RedisRefused`` of kind ``permission``)."""
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return True
    if isinstance(exc, RedisRefused):
        return exc.kind == "permission"
    return isinstance(exc, redis.exceptions.ResponseError) and (
        "NOPERM" in str(exc) or "can't run this command" in str(exc)
    )
