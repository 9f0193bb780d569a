"""The asynchronous twin of ``actors.admin.client.Client``, for trio and asyncio code.

    from actors.admin.async_client import AsyncClient

    async with AsyncClient("http://127.0.0.1:8080", "admin", secret) as api:
        await api.create_task("report", {"kind": "interval", "every_s": 3600})
        async for task in api.iter_tasks("report"):
            ...

It runs on httpx's ``AsyncClient``, which works under either event loop (through anyio),
so a trio program and an asyncio one use the same class. Its methods are those of
``Client`` with the same arguments (both come from ``actors.admin.calls.Endpoints``), each
answering an awaitable of the decoded JSON object; a request is signed when it is awaited,
so a call built and awaited later still carries a fresh timestamp. Errors are the same
``ApiError`` and ``ApiUnavailable``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, cast

import httpx

from actors.admin.calls import PAGE, Call, Endpoints, decode, prepare, unavailable
from actors.domain.api_keys import ApiKey


class AsyncClient(Endpoints[Awaitable[dict[str, Any]]]):
    """The API's endpoints as methods answering awaitables; one connection pool, closed
    by ``aclose`` or ``async with``."""

    def __init__(
        self, url: str, key_id: str, secret: str | bytes, *, timeout_s: float = 30.0
    ) -> None:
        self.url = url.rstrip("/")
        self.key = ApiKey(key_id, secret.encode() if isinstance(secret, str) else secret)
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
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
            response = await self._http.request(
                method, self.url + signed.target, content=signed.content, headers=signed.headers
            )
        except httpx.TransportError as exc:
            raise unavailable(self.url, exc) from exc
        return decode(response, answers)

    async def _send(self, call: Call) -> dict[str, Any]:
        answer = await self.request(
            call.method, call.path, params=call.params, body=call.body, answers=call.answers
        )
        return cast(dict[str, Any], answer)

    async def iter_tasks(
        self,
        task_type: str | None = None,
        status: str | None = None,
        unreadable: list[dict[str, str]] | None = None,
        **filters: Any,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every task matching, following the cursor page by page (``filters``: those of
        ``list_tasks``, ``limit`` the size of each page); the tasks whose records the node
        cannot read are appended to ``unreadable`` when it is given (``{"task_id",
        "error"}`` each)."""
        cursor = None
        size = filters.pop("limit", PAGE)  # a page's size: every task is listed
        while True:
            page = await self.list_tasks(task_type, status, cursor, size, **filters)
            if unreadable is not None:
                unreadable += page.get("unreadable", [])
            for task in page["tasks"]:
                yield task
            cursor = page["next_cursor"]
            if cursor is None:
                return
