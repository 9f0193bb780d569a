"""A Python client for the Metronome API that signs every request (``actors.api.signing``).

    from actors.admin.client import Client

    with Client("http://127.0.0.1:8080", "admin", secret) as api:
        api.create_task("report", {"kind": "cron", "cron": "0 9 * * 1-5", "tz": "Europe/Paris"},
                        payload={"to": "ops@example.com"}, task_id="daily-report")
        print(api.explain("daily-report")["summary"])

Every refusal raises ``ApiError`` carrying the problem details' status, code and field
errors; an unreachable server raises ``ApiUnavailable``. The client is synchronous (httpx
with a kept-alive connection); it is what the ``metronome`` CLI uses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import quote, urlencode

import httpx

from actors.api.signing import ApiKey, sign


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


class Client:
    def __init__(
        self, url: str, key_id: str, secret: str | bytes, *, timeout_s: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.key = ApiKey(key_id, secret.encode() if isinstance(secret, str) else secret)
        self._http = httpx.Client(timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the one request method ---------------------------------------------------------

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        """Send one signed request; the decoded JSON answer, or ApiError/ApiUnavailable."""
        query = urlencode({k: v for k, v in (params or {}).items() if v is not None}, doseq=True)
        target = path + (f"?{query}" if query else "")
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = sign(self.key, method, target, data, int(time.time() * 1000))
        if data:
            headers["Content-Type"] = "application/json"
        try:
            response = self._http.request(method, self.url + target, content=data, headers=headers)
        except httpx.TransportError as exc:
            raise ApiUnavailable(f"cannot reach {self.url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                problem = response.json()
                raise ApiError(
                    response.status_code,
                    str(problem.get("code", "error")),
                    str(problem.get("detail", response.text)),
                    problem.get("errors"),
                )
            except ValueError:
                raise ApiError(response.status_code, "error", response.text[:500]) from None
        return response.json()

    def _object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """``request`` typed for the endpoints, which all answer a JSON object."""
        return cast(dict[str, Any], self.request(method, path, **kwargs))

    # -- tasks ----------------------------------------------------------------------------

    def create_task(
        self,
        task_type: str,
        schedule: dict[str, Any],
        payload: Any = None,
        task_id: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"type": task_type, "schedule": schedule, "payload": payload}
        if task_id is not None:
            body["task_id"] = task_id
        if labels:
            body["labels"] = labels
        return self._object("POST", "/v1/tasks", body=body)

    def create_tasks(self, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        """Bulk create: each item like ``create_task``'s body (type, schedule, payload,
        task_id, labels)."""
        return self._object("POST", "/v1/tasks/bulk", body={"tasks": tasks})

    def get_task(self, task_id: str) -> dict[str, Any]:
        return self._object("GET", f"/v1/tasks/{_seg(task_id)}")

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
    ) -> dict[str, Any]:
        """A page of tasks; ``labels``: every pair must match; ``next_before``: Unix ms
        (next fire at or before); ``last_status``: ok, retry or dead."""
        params = {
            "type": task_type,
            "status": status,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "next_before": next_before,
            "last_status": last_status,
            "cursor": cursor,
            "limit": limit,
        }
        return self._object("GET", "/v1/tasks", params=params)

    def iter_tasks(
        self, task_type: str | None = None, status: str | None = None, **filters: Any
    ) -> Iterator[dict[str, Any]]:
        """Every task matching, following the cursor page by page (``filters``: those of
        ``list_tasks``)."""
        cursor = None
        while True:
            page = self.list_tasks(task_type, status, cursor, 1000, **filters)
            yield from page["tasks"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def update_task(self, task_id: str, **changes: Any) -> dict[str, Any]:
        """``payload=...``, ``schedule={...}`` and/or ``labels={...}`` (the whole set)."""
        return self._object("PATCH", f"/v1/tasks/{_seg(task_id)}", body=changes)

    def _action(self, task_id: str, action: str, body: Any = None) -> dict[str, Any]:
        return self._object("POST", f"/v1/tasks/{_seg(task_id)}/{action}", body=body)

    def pause(self, task_id: str, note: str | None = None) -> dict[str, Any]:
        """Pause; ``note`` (up to 500 characters) says why, kept with the task."""
        return self._action(task_id, "pause", None if note is None else {"note": note})

    def resume(self, task_id: str, note: str | None = None) -> dict[str, Any]:
        """Resume a paused task; ``note`` says why, kept with the task."""
        return self._action(task_id, "resume", None if note is None else {"note": note})

    def stop(self, task_id: str) -> dict[str, Any]:
        return self._action(task_id, "stop")

    def trigger(self, task_id: str, overlap: str | None = None) -> dict[str, Any]:
        """Run once now; ``overlap``: the policy this fire runs under (default allow_all)."""
        return self._action(task_id, "trigger", None if overlap is None else {"overlap": overlap})

    def backfill(
        self,
        task_id: str,
        start_ms: int,
        end_ms: int,
        overlap: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Run the task's grid times in ``[start_ms, end_ms)`` (a past window), each once
        however often this is repeated; ``dry_run``: only say which they are."""
        body: dict[str, Any] = {"start_ms": start_ms, "end_ms": end_ms, "dry_run": dry_run}
        if overlap is not None:
            body["overlap"] = overlap
        return self._object("POST", f"/v1/tasks/{_seg(task_id)}/backfill", body=body)

    def backfill_type(
        self, task_type: str, start_ms: int, end_ms: int, dry_run: bool = False
    ) -> dict[str, Any]:
        """``backfill`` for every active or paused task of a type: counts per task."""
        body = {"type": task_type, "start_ms": start_ms, "end_ms": end_ms, "dry_run": dry_run}
        return self._object("POST", "/v1/backfill", body=body)

    def delete_task(self, task_id: str) -> dict[str, Any]:
        return self._object("DELETE", f"/v1/tasks/{_seg(task_id)}")

    def explain(self, task_id: str) -> dict[str, Any]:
        return self._object("GET", f"/v1/tasks/{_seg(task_id)}/explain")

    def upcoming(self, task_id: str, n: int = 10) -> dict[str, Any]:
        """The task's next ``n`` fires: grid time (``due``) and when each is enqueued
        (``fire``: with the task's spread, without the random jitter)."""
        return self._object("GET", f"/v1/tasks/{_seg(task_id)}/upcoming", params={"n": n})

    def clear_type(self, task_type: str) -> dict[str, Any]:
        return self._object(
            "POST", f"/v1/types/{_seg(task_type)}/clear", body={"confirm": task_type}
        )

    # -- queues and dead letters ----------------------------------------------------------

    def queues(self, task_type: str | None = None) -> dict[str, Any]:
        path = "/v1/queues" + (f"/{_seg(task_type)}" if task_type else "")
        return self._object("GET", path)

    def partitions(self) -> dict[str, Any]:
        """Which poller serves each partition, until when, and how much of it is due."""
        return self._object("GET", "/v1/partitions")

    def purge_queue(self, task_type: str) -> dict[str, Any]:
        """Delete the type's undelivered messages (their fires do not run)."""
        return self._object(
            "POST", f"/v1/queues/{_seg(task_type)}/purge", body={"confirm": task_type}
        )

    def dead_letters(
        self, task_type: str, before: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        return self._object(
            "GET", f"/v1/dlq/{_seg(task_type)}", params={"before": before, "limit": limit}
        )

    def dead_letter(self, task_type: str, entry_id: str) -> dict[str, Any]:
        return self._object("GET", f"/v1/dlq/{_seg(task_type)}/{_seg(entry_id)}")

    def replay(self, task_type: str, entry_ids: list[str] | None = None) -> dict[str, Any]:
        """Replay the given dead letters, or all of the type when ``entry_ids`` is None."""
        body = {"all": True} if entry_ids is None else {"entry_ids": entry_ids}
        return self._object("POST", f"/v1/dlq/{_seg(task_type)}/replay", body=body)

    def purge(self, task_type: str, entry_ids: list[str] | None = None) -> dict[str, Any]:
        """Delete the given dead letters, or all of the type when ``entry_ids`` is None."""
        body: dict[str, Any] = (
            {"all": True, "confirm": task_type} if entry_ids is None else {"entry_ids": entry_ids}
        )
        return self._object("POST", f"/v1/dlq/{_seg(task_type)}/purge", body=body)


def _seg(value: str) -> str:
    """A path segment, percent-encoded (the server refuses anything but safe names anyway)."""
    return quote(value, safe="")
