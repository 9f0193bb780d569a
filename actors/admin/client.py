"""A Python client for the Metronome API that signs every request (``actors.api.signing``).

    from actors.admin.client import Client

    with Client("http://127.0.0.1:8080", "admin", secret) as api:
        api.create_task("report", {"kind": "cron", "cron": "0 9 * * 1-5", "tz": "Europe/Paris"},
                        payload={"to": "ops@example.com"}, task_id="daily-report")
        print(api.explain("daily-report")["summary"])

Every refusal raises ``ApiError`` carrying the problem details' status, code and field
errors; an unreachable server raises ``ApiUnavailable``. The client is synchronous (httpx
with a kept-alive connection); it is what the ``metronome`` CLI uses. ``AsyncClient``
(``actors.admin.async_client``, exported here too) offers the same methods to trio and
asyncio code. Both take their endpoint methods from ``actors.admin.calls.Endpoints``:
this module only sends the requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import httpx

from actors.admin.async_client import AsyncClient
from actors.admin.calls import PAGE, ApiError, ApiUnavailable, Call, Endpoints, decode, prepare
from actors.admin.calls import unavailable as _unavailable
from actors.domain.api_keys import ApiKey

__all__ = ["ApiError", "ApiUnavailable", "AsyncClient", "Client"]


class Client(Endpoints[dict[str, Any]]):
    """The API's endpoints as blocking methods, each answering the decoded JSON object."""

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

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        answers: frozenset[int] = frozenset(),
    ) -> Any:
        """Send one signed request; the decoded JSON answer, or ApiError/ApiUnavailable."""
        signed = prepare(self.key, method, path, params, body)
        try:
            response = self._http.request(
                method, self.url + signed.target, content=signed.content, headers=signed.headers
            )
        except httpx.TransportError as exc:
            raise _unavailable(self.url, exc) from exc
        return decode(response, answers)

    def _send(self, call: Call) -> dict[str, Any]:
        answer = self.request(
            call.method, call.path, params=call.params, body=call.body, answers=call.answers
        )
        return cast(dict[str, Any], answer)

    def iter_tasks(
        self,
        task_type: str | None = None,
        status: str | None = None,
        unreadable: list[dict[str, str]] | None = None,
        **filters: Any,
    ) -> Iterator[dict[str, Any]]:
        """Every task matching, following the cursor page by page (``filters``: those of
        ``list_tasks``, ``limit`` the size of each page); the tasks whose records the node
        cannot read are appended to ``unreadable`` when it is given (``{"task_id",
        "error"}`` each)."""
        cursor = None
        size = filters.pop("limit", PAGE)  # a page's size: every task is listed
        while True:
            page = self.list_tasks(task_type, status, cursor, size, **filters)
            if unreadable is not None:
                unreadable += page.get("unreadable", [])
            yield from page["tasks"]
            cursor = page["next_cursor"]
            if cursor is None:
                return
