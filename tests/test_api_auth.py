"""Authentication of the served API, end to end: every refusal has its status, its code and
a message, and leaves Redis as it was. (The signature scheme itself: test_signing.py.)"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from actors.admin.client import Client
from actors.api.signing import sign
from actors.domain.api_keys import ApiKey
from actors.store.keys import Keys
from tests import stored
from tests.api_node import ADMIN, READER, ApiNode, plain_api_node

ADMIN_KEY = ApiKey(ADMIN[0], ADMIN[1].encode())
SCHEDULE: dict[str, Any] = {"kind": "interval", "every_s": 3600}
TASK: dict[str, Any] = {"type": "idle", "schedule": SCHEDULE}


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    with plain_api_node(redis_url, tmp_path_factory.mktemp("auth"), "auth") as node:
        yield node


def now_ms() -> int:
    return int(time.time() * 1000)


def body_for(task_id: str) -> bytes:
    return json.dumps({**TASK, "task_id": task_id}).encode()


def post(api: ApiNode, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(api.url + "/v1/tasks", content=body, headers=headers)


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code
    assert ADMIN[1] not in response.text  # never a secret, whole or in part
    return str(problem["detail"])


def nonces(db: redis.Redis, namespace: str) -> int:
    return sum(1 for _ in db.scan_iter(f"{namespace}:nonce:*", count=1000))


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("no key header", 401, "missing_header"),
        ("no signature", 401, "missing_header"),
        ("timestamp not a number", 401, "malformed"),
        ("nonce too short", 401, "malformed"),
        ("signature not hex", 401, "malformed"),
        ("unknown key", 401, "bad_signature"),  # the same answer: ids cannot be probed
        ("expired", 401, "skew"),
        ("from the future", 401, "skew"),
        ("signed another body", 401, "bad_signature"),
        ("signed another path", 401, "bad_signature"),
        ("wrong secret", 401, "bad_signature"),
    ],
)
def test_each_bad_request_is_refused_with_its_reason_and_changes_nothing(
    api: ApiNode, db: redis.Redis, case: str, status: int, code: str
) -> None:
    task_id = f"auth-{time.monotonic_ns()}"
    body = body_for(task_id)
    headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body, now_ms())
    if case == "no key header":
        del headers["X-Metronome-Key"]
    elif case == "no signature":
        del headers["X-Metronome-Signature"]
    elif case == "timestamp not a number":
        headers["X-Metronome-Timestamp"] = "soon"
    elif case == "nonce too short":
        headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body, now_ms(), nonce="short")
    elif case == "signature not hex":
        headers["X-Metronome-Signature"] = "z" * 64
    elif case == "unknown key":
        headers = sign(ApiKey("intruder", ADMIN[1].encode()), "POST", "/v1/tasks", body, now_ms())
    elif case == "expired":
        headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body, now_ms() - 301_000)
    elif case == "from the future":
        headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body, now_ms() + 301_000)
    elif case == "signed another body":
        headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body_for("other"), now_ms())
    elif case == "signed another path":
        headers = sign(ADMIN_KEY, "POST", "/v1/tasks/bulk", body, now_ms())
    elif case == "wrong secret":
        headers = sign(ApiKey(ADMIN[0], b"not-the-secret-at-all"), "POST", "/v1/tasks", body,
                       now_ms())  # fmt: skip
    before = nonces(db, api.namespace)
    detail = refused(post(api, body, headers), status, code)
    assert detail
    keys = Keys(api.namespace, 16)
    assert not stored.exists(db, keys, task_id)
    assert nonces(db, api.namespace) == before  # no nonce stored for a refused request


def test_a_replayed_request_is_refused_even_inside_the_window(
    api: ApiNode, db: redis.Redis
) -> None:
    keys = Keys(api.namespace, 16)
    task_id = f"replay-{time.monotonic_ns()}"
    with Client(api.url, *ADMIN) as client:
        client.create_task("idle", SCHEDULE, {"v": 1}, task_id)
        path = f"/v1/tasks/{task_id}"
        change = json.dumps({"payload": {"v": 2}}).encode()
        headers = sign(ADMIN_KEY, "PATCH", path, change, now_ms())
        first = httpx.patch(api.url + path, content=change, headers=headers)
        assert first.status_code == 200
        client.update_task(task_id, payload={"v": 3})
        again = httpx.patch(api.url + path, content=change, headers=headers)
        refused(again, 401, "replay")
    assert stored.payload(db, keys, task_id) == {"v": 3}
    # kept past the window the timestamp is acceptable in (a skew each side), with room
    (nonce_key,) = db.keys(f"{api.namespace}:nonce:*{headers['X-Metronome-Nonce']}")
    assert db.pttl(nonce_key) > 2 * 300_000


def _answer_to_a_body_never_sent(api: ApiNode, headers: dict[str, str]) -> bytes:
    """The status line answered to a POST that declares a 1 MB body and sends none."""
    url = httpx.URL(api.url)
    lines = ["POST /v1/tasks HTTP/1.1", f"Host: {url.host}", "Content-Length: 1000000"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((url.host, url.port), timeout=20) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            return conn.recv(200).split(b"\r\n", 1)[0]
        except TimeoutError:
            return b"(no answer: the server waits for the body)"


@pytest.mark.parametrize("case", ["no headers", "an old timestamp"])
def test_a_request_whose_headers_cannot_pass_is_refused_before_its_body_is_read(
    api: ApiNode, case: str
) -> None:
    """A client without a well-formed, current request does not get the server to buffer
    a body (up to ``max_body_bytes``) while it sends it slowly or never."""
    headers = {} if case == "no headers" else sign(ADMIN_KEY, "POST", "/v1/tasks", b"x", 0)
    assert _answer_to_a_body_never_sent(api, headers).startswith(b"HTTP/1.1 401")


@pytest.mark.parametrize("case", ["an old timestamp", "a declared length too large"])
def test_a_client_still_sending_a_refused_body_can_send_it_and_read_its_answer(
    api: ApiNode, case: str
) -> None:
    """A request refused before its body is read (the client's clock off: its timestamp
    out of the window; or a declared length over max_body_bytes, 8 MiB here, sent whole)
    from a client that sends a whole body before it reads an answer, as most do: it sends
    it all and reads its answer, rather than an upload reset, or left hanging until its
    timeout, as the server closes the connection (the server reads the rest of the body,
    up to twice max_body_bytes, and drops it, before it ends the answer)."""
    size = 6_000_000 if case == "an old timestamp" else 16_000_000
    body = b"[" + b" " * size + b"]"
    headers = sign(ADMIN_KEY, "POST", "/v1/tasks", body, now_ms() - 301_000)
    length = len(body)
    url = httpx.URL(api.url)
    lines = ["POST /v1/tasks HTTP/1.1", f"Host: {url.host}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    with socket.create_connection((url.host, url.port), timeout=60) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        for at in range(0, len(body), 1 << 20):  # not reset, nor left hanging (a timeout)
            conn.sendall(body[at : at + (1 << 20)])
        answer = conn.recv(200).split(b"\r\n", 1)[0]
    assert answer.startswith(b"HTTP/1.1 401" if case == "an old timestamp" else b"HTTP/1.1 413")
    status, code = (401, "skew") if case == "an old timestamp" else (413, "too_large")
    refused(httpx.post(api.url + "/v1/tasks", content=body, headers=headers), status, code)


def test_reads_are_signed_too(api: ApiNode) -> None:
    refused(httpx.get(api.url + "/v1/tasks"), 401, "missing_header")
    refused(httpx.get(api.url + "/v1/queues"), 401, "missing_header")
    assert httpx.get(api.url + "/v1/tasks").headers["www-authenticate"] == "Metronome-HMAC"


def test_a_read_only_key_is_refused_writes_with_403(api: ApiNode, db: redis.Redis) -> None:
    task_id = f"ro-{time.monotonic_ns()}"
    body = body_for(task_id)
    headers = sign(ApiKey(READER[0], READER[1].encode()), "POST", "/v1/tasks", body, now_ms())
    refused(post(api, body, headers), 403, "read_only")
    assert not stored.exists(db, Keys(api.namespace, 16), task_id)


def test_keys_never_reach_the_log(api: ApiNode, tmp_path: Path) -> None:
    with Client(api.url, *ADMIN) as client:
        client.queues()
        client.create_task("idle", SCHEDULE, None)
    text = "".join(api.node.raw) + api.node.stderr_text()
    assert "api_request" in text
    assert ADMIN[1] not in text and READER[1] not in text
