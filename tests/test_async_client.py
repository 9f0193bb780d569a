"""The Python clients against a real node: one scenario, every kind of endpoint, run through
the blocking ``Client`` and through ``AsyncClient`` under trio and under asyncio, so the two
answer alike; and a check that both have a method for every route of the API's table.

The scenario is written once, against ``Api``: an adapter that calls a client's method by
name (awaiting the answer for the async client) and lists tasks through its pagination
helper (``iter_tasks``, an iterator or an async iterator).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from actors.admin.async_client import AsyncClient
from actors.admin.calls import Call, Endpoints, decode
from actors.admin.client import ApiError, ApiUnavailable, Client
from actors.api.app import ROUTES
from actors.api.endpoint import Endpoint
from runtime.version import __version__
from tests.api_node import ADMIN, WORK_AND_DOOMED, ApiNode, recording_api_node, unique

HOUR = 3_600_000
#: First fire in 2100: tasks that must not fire while the scenario looks at them.
LATER = 4102444800000
EVERY_HOUR = {"kind": "interval", "every_s": 3600, "start_ms": LATER}
HOURLY = {"kind": "cron", "cron": "0 * * * *", "tz": "UTC"}
#: Nothing listens there: connections are refused at once.
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url,
        tmp_path_factory.mktemp("clients"),
        "clients",
        record_file,
        consumers=WORK_AND_DOOMED,
    ) as node:
        yield node


class Api(Protocol):
    """What the scenario needs of a client, whichever kind it is."""

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def all_tasks(self, task_type: str) -> list[dict[str, Any]]: ...


class Blocking:
    """``Api`` over ``Client``: each call blocks (the scenario's loop waits meanwhile)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.client, method)(*args, **kwargs)

    async def all_tasks(self, task_type: str) -> list[dict[str, Any]]:
        return list(self.client.iter_tasks(task_type))


class Awaiting:
    """``Api`` over ``AsyncClient``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.client, method)(*args, **kwargs)

    async def all_tasks(self, task_type: str) -> list[dict[str, Any]]:
        return [task async for task in self.client.iter_tasks(task_type)]


async def scenario(api: Api) -> None:
    """A task type of its own through its whole life: every assertion holds for any client."""
    kind = unique("kind").replace("-", "x")
    first = unique("first")
    assert await api("create_task", kind, EVERY_HOUR, {"n": 0}, first) == {
        "task_id": first,
        "created": True,
    }
    more: list[dict[str, Any]] = [
        {"type": kind, "schedule": EVERY_HOUR, "payload": {"n": i}, "task_id": f"{first}-{i}"}
        for i in (1, 2)
    ]
    more.append({"type": kind, "schedule": HOURLY, "payload": None, "task_id": f"{first}-cron"})
    bulk = await api("create_tasks", more)
    assert (bulk["created"], bulk["existing"], bulk["conflicts"]) == (3, 0, 0)
    ids = {first, *(t["task_id"] for t in more)}

    task = await api("get_task", first)
    assert (task["type"], task["payload"], task["status"]) == (kind, {"n": 0}, "active")
    page = await api("list_tasks", kind, None, None, 2)
    # (a limit is a hint: a page holds what its slice of the keyspace holds)
    assert {t["task_id"] for t in page["tasks"]} <= ids and "next_cursor" in page
    assert {t["task_id"] for t in await api.all_tasks(kind)} == ids

    await api("update_task", first, payload={"n": 10})
    assert (await api("get_task", first))["payload"] == {"n": 10}
    assert (await api("pause", first, note="vendor outage"))["status"] == "paused"
    assert (await api("get_task", first))["note"]["note"] == "vendor outage"
    assert (await api("resume", first))["status"] == "active"
    assert (await api("stop", f"{first}-2"))["status"] == "stopped"

    assert await api("history", first) == {"task_id": first, "history": []}
    assert await api("attention", kind) == {"items": [], "cursor": None}
    acked = await api("acknowledge", first, note="nothing to see")
    assert (acked["acknowledged"], acked["entry"]) == (False, None)
    assert (await api("list_tasks", kind, last_fate="dead"))["tasks"] == []
    triggered = await api("trigger", first)
    assert triggered["schedule_id"].startswith(f"{first}:")
    fires = (await api("upcoming", first, 3))["fires"]
    assert [f["due_ms"] for f in fires] == [LATER + k * HOUR for k in range(3)]
    assert (await api("explain", first))["summary"]

    now = int(time.time() * 1000)
    start, end = now - now % HOUR - 3 * HOUR, now - now % HOUR
    dry = await api("backfill", f"{first}-cron", start, end, dry_run=True)
    assert [f["due_ms"] for f in dry["fires"]] == [start + k * HOUR for k in range(3)]
    assert (dry["enqueued"], dry["dry_run"]) == (0, True)
    by_type = await api("backfill_type", kind, start, end, dry_run=True)
    assert by_type["enqueued"] == 0
    assert {t["task_id"]: t["fires"] for t in by_type["tasks"]}[f"{first}-cron"] == 3

    # The trigger's fire waits in the type's queue: no node consumes this type.
    # (the cron task may add its own fire, should the hour turn meanwhile)
    one = await api("queue", kind)
    assert one["type"] == kind and one["undelivered"] >= 1 and one["consumers"] == []
    assert (await api("queues", kind))["undelivered"] == one["undelivered"]
    assert kind in {q["type"] for q in (await api("queues"))["queues"]}
    assert await api("dead_letters", kind) == {"dead_letters": [], "next_cursor": None}
    assert (await api("purge_queue", kind))["purged"] >= 1
    assert (await api("queue", kind))["undelivered"] == 0

    assert await api("whoami") == {"key_id": ADMIN[0], "read_only": False}
    assert (await api("nodes"))["processes"]
    assert "partitions" in await api("partitions")
    assert await api("healthz") == {"status": "ok", "version": __version__}
    assert (await api("readyz"))["ready"] is True

    assert (await api("delete_task", first))["task_id"] == first
    with pytest.raises(ApiError) as gone:
        await api("get_task", first)
    assert (gone.value.status, gone.value.code) == (404, "not_found")
    assert (await api("clear_type", kind))["deleted"] == 3
    assert await api.all_tasks(kind) == []


def test_the_blocking_client(client: Client) -> None:
    asyncio.run(scenario(Blocking(client)))


async def test_the_async_client_under_trio(api: ApiNode) -> None:
    async with AsyncClient(api.url, *ADMIN) as client:
        await scenario(Awaiting(client))


def test_the_async_client_under_asyncio(api: ApiNode) -> None:
    async def main() -> None:
        async with AsyncClient(api.url, *ADMIN) as client:
            await scenario(Awaiting(client))

    asyncio.run(main())


async def test_errors_are_the_same_under_both(api: ApiNode) -> None:
    async with AsyncClient(NOWHERE, *ADMIN, timeout_s=5) as nowhere:
        with pytest.raises(ApiUnavailable):
            await nowhere.whoami()
    with Client(NOWHERE, *ADMIN, timeout_s=5) as blocking, pytest.raises(ApiUnavailable):
        blocking.whoami()
    async with AsyncClient(api.url, ADMIN[0], "not-the-secret") as wrong:
        with pytest.raises(ApiError) as refused:
            await wrong.whoami()
    assert (refused.value.status, refused.value.code) == (401, "bad_signature")


# -- every route has a method, in both clients -------------------------------------------


class Recorder(Endpoints[Call]):
    """The endpoint methods with ``_send`` answering the call they build, unsent."""

    def _send(self, call: Call) -> Call:
        return call


#: An argument of each annotated type, to call every endpoint method with.
SAMPLES: dict[Any, Any] = {
    str: "x",
    int: 1,
    bool: True,
    Any: None,
    dict[str, Any]: {},
    dict[str, str]: {"k": "v"},
    list[str]: ["x"],
    list[dict[str, Any]]: [],
}


def sample(annotation: Any) -> Any:
    """A value of ``annotation``: of its non-None member for an optional one."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation in SAMPLES:
        return SAMPLES[annotation]
    assert len(members) == 1, f"add a sample of {annotation} to SAMPLES"
    return SAMPLES[members[0]]


def calls_of(name: str) -> list[Call]:
    """What the endpoint method builds with only its required arguments, and with all."""
    method = getattr(Recorder(), name)
    hints = typing.get_type_hints(method)
    params = [
        p
        for p in inspect.signature(method).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    required = {p.name: sample(hints[p.name]) for p in params if p.default is p.empty}
    every = {p.name: sample(hints[p.name]) for p in params}
    return [method(**required), method(**every)]


ENDPOINT_METHODS = [
    name for name, value in vars(Endpoints).items() if callable(value) and not name.startswith("_")
]


def matches(call: Call, method: str, template: str) -> bool:
    pattern = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template))
    return call.method == method and re.fullmatch(pattern, call.path) is not None


def route_of(call: Call) -> Endpoint | None:
    """The route that serves ``call``: the first that matches, as the app picks it."""
    return next((r for r in ROUTES if matches(call, r.method, r.path)), None)


def test_every_route_has_a_method_in_both_clients() -> None:
    served: set[tuple[str, str]] = set()
    for name in ENDPOINT_METHODS:
        for call in calls_of(name):
            route = route_of(call)
            assert route is not None, f"{name} calls {call.method} {call.path}: no such route"
            assert set(call.params or {}) <= {*route.query}, f"{name}: unknown query parameter"
            assert call.body is None or route.body is not None, f"{name} sends a body"
            served.add((route.method, route.path))
    missing = {(r.method, r.path) for r in ROUTES} - served
    assert not missing, f"routes no client method calls: {sorted(missing)}"
    for client in (Client, AsyncClient):
        for name in [*ENDPOINT_METHODS, "iter_tasks", "request"]:
            assert callable(getattr(client, name)), f"{client.__name__} lacks {name}"
    assert (
        inspect.signature(AsyncClient.iter_tasks).parameters
        == inspect.signature(Client.iter_tasks).parameters
    )


def test_the_async_client_signs_a_call_when_it_is_awaited() -> None:
    """A method's answer is a coroutine that has sent and signed nothing yet: awaited
    later, its timestamp is still fresh."""
    client = AsyncClient(NOWHERE, *ADMIN)
    pending = client.whoami()
    assert inspect.iscoroutine(pending)
    pending.close()
    asyncio.run(client.aclose())


def test_an_answer_that_is_not_the_apis_is_an_api_error() -> None:
    """Every refusal is an ``ApiError`` (docs/API.md): a 2xx that is not JSON (a proxy's
    login page) raised a JSONDecodeError, and an error whose JSON is no object an
    AttributeError."""
    with pytest.raises(ApiError) as page:
        decode(httpx.Response(200, text="<html>sign in</html>"))
    assert page.value.code == "not_the_api" and "sign in" in page.value.detail
    with pytest.raises(ApiError) as listed:
        decode(httpx.Response(502, json=["bad gateway"]))
    assert listed.value.status == 502 and "bad gateway" in listed.value.detail
    assert decode(httpx.Response(200, json={"a": 1})) == {"a": 1}
