"""Every API endpoint described once, for the synchronous and the asynchronous client alike.

``Endpoints`` has one method per endpoint of the route table (``actors.api.app.ROUTES``);
each only builds a ``Call`` (HTTP method, path, query, body) and hands it to ``_send``,
which a client implements: ``Client`` sends it at once and answers the decoded JSON,
``AsyncClient`` answers an awaitable of it. So the two clients offer the same methods with
the same signatures, and an endpoint's arguments are mapped to the request in one place.

The request bytes and their signature (``prepare``) and the reading of an answer
(``decode``) are shared too, so both clients sign the exact same canonical string
(``actors.api.signing``) and raise the same ``ApiError`` / ``ApiUnavailable``.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import attrs
import httpx

from actors.api.signing import sign
from actors.domain.api_keys import ApiKey

R = TypeVar("R")
#: How many tasks ``iter_tasks`` asks for per page (the API's largest page).
PAGE = 1000


class ApiError(Exception):
    """The API refused a request; ``code`` is stable (``not_found``, ``invalid``, ``replay``…)."""

    def __init__(self, status: int, code: str, detail: str, errors: list[Any] | None = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors or []


class ApiUnavailable(Exception):
    """The API could not be reached (connection refused, timeout)."""


@attrs.frozen
class Call:
    """One request to make: what an ``Endpoints`` method turns its arguments into."""

    method: str
    path: str
    """Percent-encoded, without the query."""
    params: dict[str, Any] | None = None
    """The query; None values are left out."""
    body: Any = None
    """JSON; None sends no body."""
    answers: frozenset[int] = frozenset()
    """Error statuses that are still an answer to return (``/readyz``'s 503: not ready)."""


@attrs.frozen
class Prepared:
    """A call's signed target (path and query), body bytes and headers."""

    target: str
    content: bytes
    headers: dict[str, str]


def prepare(
    key: ApiKey, method: str, path: str, params: dict[str, Any] | None, body: Any
) -> Prepared:
    """Sign one request, now: the server checks the canonical string of exactly this
    target (path and query as sent) and these body bytes."""
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
    target = path + (f"?{query}" if query else "")
    data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
    headers = sign(key, method, target, data, int(time.time() * 1000))
    if data:
        headers["Content-Type"] = "application/json"
    return Prepared(target, data, headers)


def decode(response: httpx.Response, answers: frozenset[int] = frozenset()) -> Any:
    """The answer's JSON, or ``ApiError`` from its problem details (a status of 400 or
    more that ``answers`` does not name)."""
    if response.status_code >= 400 and response.status_code not in answers:
        try:
            problem = response.json()
        except ValueError:
            raise ApiError(response.status_code, "error", response.text[:500]) from None
        if not isinstance(problem, dict):  # a proxy's answer, not the API's
            raise ApiError(response.status_code, "error", response.text[:500])
        raise ApiError(
            response.status_code,
            str(problem.get("code", "error")),
            str(problem.get("detail", response.text)),
            problem.get("errors"),
        )
    try:
        return response.json()
    except ValueError:  # a 2xx or 3xx not the API's (a login page, a redirect)
        raise ApiError(
            response.status_code, "not_the_api",
            f"the answer is not JSON: {response.text[:200]!r} (is the URL the API's?)",
        ) from None  # fmt: skip


def unavailable(url: str, exc: httpx.TransportError) -> ApiUnavailable:
    return ApiUnavailable(f"cannot reach {url}: {exc}")


class Endpoints(ABC, Generic[R]):
    """The API's endpoints as methods; ``R`` is what a client's ``_send`` answers (the JSON
    object, or an awaitable of it)."""

    @abstractmethod
    def _send(self, call: Call) -> R:
        """Make the call (signed); its JSON object, or an awaitable of it."""

    # -- tasks ----------------------------------------------------------------------------

    def create_task(
        self,
        task_type: str,
        schedule: dict[str, Any],
        payload: Any = None,
        task_id: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> R:
        """Idempotent with a ``task_id`` of the caller's (the same definition again is not
        created twice; another one is a 409)."""
        body: dict[str, Any] = {"type": task_type, "schedule": schedule, "payload": payload}
        if task_id is not None:
            body["task_id"] = task_id
        if labels:
            body["labels"] = labels
        return self._send(Call("POST", "/v1/tasks", body=body))

    def create_tasks(self, tasks: list[dict[str, Any]]) -> R:
        """Bulk create: each item like ``create_task``'s body (type, schedule, payload,
        task_id, labels)."""
        return self._send(Call("POST", "/v1/tasks/bulk", body={"tasks": tasks}))

    def get_task(self, task_id: str) -> R:
        return self._send(Call("GET", _task(task_id)))

    def list_tasks(
        self,
        task_type: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        *,
        labels: dict[str, str] | None = None,
        next_before: int | None = None,
        last_status: str | None = None,
        last_fate: str | None = None,
    ) -> R:
        """One page; ``next_cursor`` asks for the next (``iter_tasks`` follows them all).
        ``labels``: every pair must match; ``next_before``: Unix ms (next fire at or
        before); ``last_status``: ok, retry or dead; ``last_fate``: the latest
        occurrence's fate (ok, failed, dead, cancelled, skipped, coalesced)."""
        params = {
            "type": task_type,
            "status": status,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "next_before": next_before,
            "last_status": last_status,
            "last_fate": last_fate,
            "cursor": cursor,
            "limit": limit,
        }
        return self._send(Call("GET", "/v1/tasks", params=params))

    def update_task(self, task_id: str, **changes: Any) -> R:
        """``payload=...``, ``schedule={...}`` and/or ``labels={...}`` (the whole set)."""
        return self._send(Call("PATCH", _task(task_id), body=changes))

    def pause(self, task_id: str, note: str | None = None) -> R:
        """Pause; ``note`` (up to 500 characters) says why, kept with the task."""
        return self._send(Call("POST", _task(task_id, "pause"), body=_maybe("note", note)))

    def resume(self, task_id: str, note: str | None = None) -> R:
        """Resume a paused task; ``note`` says why, kept with the task."""
        return self._send(Call("POST", _task(task_id, "resume"), body=_maybe("note", note)))

    def stop(self, task_id: str) -> R:
        return self._send(Call("POST", _task(task_id, "stop")))

    def trigger(self, task_id: str, overlap: str | None = None) -> R:
        """Run once now; ``overlap``: the policy this fire runs under (default allow_all)."""
        body = _maybe("overlap", overlap)
        return self._send(Call("POST", _task(task_id, "trigger"), body=body))

    def backfill(
        self,
        task_id: str,
        start_ms: int,
        end_ms: int,
        overlap: str | None = None,
        dry_run: bool = False,
    ) -> R:
        """Run the task's grid times in ``[start_ms, end_ms)`` (a past window), each once
        however often this is repeated; ``dry_run``: only say which they are."""
        body: dict[str, Any] = {"start_ms": start_ms, "end_ms": end_ms, "dry_run": dry_run}
        if overlap is not None:
            body["overlap"] = overlap
        return self._send(Call("POST", _task(task_id, "backfill"), body=body))

    def backfill_type(self, task_type: str, start_ms: int, end_ms: int, dry_run: bool = False) -> R:
        """``backfill`` for every active or paused task of a type: counts per task."""
        body = {"type": task_type, "start_ms": start_ms, "end_ms": end_ms, "dry_run": dry_run}
        return self._send(Call("POST", "/v1/backfill", body=body))

    def delete_task(self, task_id: str) -> R:
        return self._send(Call("DELETE", _task(task_id)))

    def explain(self, task_id: str) -> R:
        """Why the task is or is not running: facts and a ``summary`` in words."""
        return self._send(Call("GET", _task(task_id, "explain")))

    def upcoming(self, task_id: str, n: int = 10) -> R:
        """The task's next ``n`` fires: grid time (``due``) and when each is enqueued
        (``fire``: with the task's spread, without the random jitter)."""
        return self._send(Call("GET", _task(task_id, "upcoming"), params={"n": n}))

    def history(self, task_id: str, limit: int | None = None) -> R:
        """The task's last occurrences, newest first: fate, origin, due, start, end, node,
        attempt and error line of each."""
        return self._send(Call("GET", _task(task_id, "history"), params={"limit": limit}))

    def attention(
        self,
        task_type: str | None = None,
        reason: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> R:
        """One page of the tasks whose latest occurrence needs an operator (``reason``:
        dead, expired, skipped, late); ``cursor`` asks for the next."""
        params = {"type": task_type, "reason": reason, "cursor": cursor, "limit": limit}
        return self._send(Call("GET", "/v1/attention", params=params))

    def acknowledge(self, task_id: str, note: str | None = None) -> R:
        """Take the task off the attention list; ``note`` says why."""
        return self._send(Call("POST", _task(task_id, "acknowledge"), body=_maybe("note", note)))

    def clear_type(self, task_type: str) -> R:
        """Delete every task of the type (the API wants the type repeated as confirmation)."""
        body = {"confirm": task_type}
        return self._send(Call("POST", f"/v1/types/{_seg(task_type)}/clear", body=body))

    # -- actions over selected tasks ------------------------------------------------------

    def tasks_action(
        self,
        action: str,
        selector: dict[str, Any],
        *,
        dry_run: bool = False,
        every: bool = False,
        note: str | None = None,
        overlap: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        action_id: str | None = None,
    ) -> R:
        """Pause, resume, stop, trigger, delete or backfill every task ``selector`` matches
        (``type``, ``status``, ``labels``, ``next_before``, ``last_status``, ``ids``);
        ``dry_run``: only count them; ``every``: an empty selector means every task;
        ``action_id``: yours, so a repeat continues the action and changes nothing twice."""
        body: dict[str, Any] = {"selector": selector, "action": action, "dry_run": dry_run}
        extra = {"note": note, "overlap": overlap, "start_ms": start_ms, "end_ms": end_ms,
                 "action_id": action_id, "all": every or None}  # fmt: skip
        body.update({k: v for k, v in extra.items() if v is not None})
        return self._send(Call("POST", "/v1/tasks/actions", body=body))

    def action_status(self, action_id: str) -> R:
        """An action's state and progress (counts so far, partitions done)."""
        return self._send(Call("GET", f"/v1/tasks/actions/{_seg(action_id)}"))

    # -- queues and dead letters ----------------------------------------------------------

    def queues(self, task_type: str | None = None) -> R:
        """Backlog of every type, or of one (the same as ``queue``)."""
        if task_type:
            return self.queue(task_type)
        return self._send(Call("GET", "/v1/queues"))

    def queue(self, task_type: str) -> R:
        """Backlog, pending, consumers, retries and dead letters of one type."""
        return self._send(Call("GET", f"/v1/queues/{_seg(task_type)}"))

    def purge_queue(self, task_type: str) -> R:
        """Delete the type's undelivered messages (their fires do not run)."""
        body = {"confirm": task_type}
        return self._send(Call("POST", f"/v1/queues/{_seg(task_type)}/purge", body=body))

    def dead_letters(
        self, task_type: str, before: str | None = None, limit: int | None = None
    ) -> R:
        """A page of the type's dead letters, newest first; ``before`` an entry id."""
        params = {"before": before, "limit": limit}
        return self._send(Call("GET", f"/v1/dlq/{_seg(task_type)}", params=params))

    def dead_letter(self, task_type: str, entry_id: str) -> R:
        return self._send(Call("GET", f"/v1/dlq/{_seg(task_type)}/{_seg(entry_id)}"))

    def replay(self, task_type: str, entry_ids: list[str] | None = None) -> R:
        """Replay the given dead letters, or all of the type when ``entry_ids`` is None."""
        body = {"all": True} if entry_ids is None else {"entry_ids": entry_ids}
        return self._send(Call("POST", f"/v1/dlq/{_seg(task_type)}/replay", body=body))

    def purge(self, task_type: str, entry_ids: list[str] | None = None) -> R:
        """Delete the given dead letters, or all of the type when ``entry_ids`` is None."""
        body: dict[str, Any] = (
            {"all": True, "confirm": task_type} if entry_ids is None else {"entry_ids": entry_ids}
        )
        return self._send(Call("POST", f"/v1/dlq/{_seg(task_type)}/purge", body=body))

    # -- the cluster and the caller -------------------------------------------------------

    def partitions(self) -> R:
        """Which poller serves each partition, until when, and how much of it is due."""
        return self._send(Call("GET", "/v1/partitions"))

    def nodes(self) -> R:
        """Every process of the namespace's nodes: its actors (up, down and why), restarts."""
        return self._send(Call("GET", "/v1/nodes"))

    def whoami(self) -> R:
        """The key these requests are signed with, and whether it may write."""
        return self._send(Call("GET", "/v1/whoami"))

    def healthz(self) -> R:
        """``{"status": "ok"}`` while the process is up."""
        return self._send(Call("GET", "/healthz"))

    def readyz(self) -> R:
        """Whether the node is ready (``ready``: Redis reachable and every actor running);
        a node that is not answers 503 with the same object, returned, not raised."""
        return self._send(Call("GET", "/readyz", answers=frozenset({503})))


def _task(task_id: str, action: str | None = None) -> str:
    return f"/v1/tasks/{_seg(task_id)}" + (f"/{action}" if action else "")


def _maybe(name: str, value: Any) -> dict[str, Any] | None:
    """An optional body of one field: none at all when the field is not given."""
    return None if value is None else {name: value}


def _seg(value: str) -> str:
    """A path segment, percent-encoded (the server refuses anything but safe names anyway)."""
    return quote(value, safe="")
