"""How the API reads a request's body: whole, bounded in size and in time, and a client
that leaves halfway is no server error."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from starlette.requests import ClientDisconnect, Request

from actors.api.problems import Problem, from_exception
from actors.api.routes import BODY_READ_S, _read_body


def _post(receive: Any) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/v1/tasks", "query_string": b"",
             "headers": [(b"content-length", b"10")]}  # fmt: skip
    return Request(scope, receive)


async def test_a_body_that_never_arrives_whole_is_refused_with_408(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sent: list[int] = []

    async def receive() -> dict[str, Any]:
        if not sent:  # a part, then nothing more
            sent.append(1)
            return {"type": "http.request", "body": b"12345", "more_body": True}
        await trio.sleep_forever()
        raise AssertionError

    started = trio.current_time()
    with pytest.raises(Problem) as refused:
        await _read_body(_post(receive), 1000)
    assert (refused.value.status, refused.value.code) == (408, "body_timeout")
    assert trio.current_time() - started == pytest.approx(BODY_READ_S)
    assert refused.value.to_dict()["title"] != "Error"


async def test_a_client_that_leaves_before_its_body_is_whole_is_a_400_not_a_500() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect) as left:
        await _read_body(_post(receive), 1000)
    problem = from_exception(left.value)
    assert problem is not None and (problem.status, problem.code) == (400, "client_disconnected")
