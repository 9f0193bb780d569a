"""The API's hardening, end to end against a real node: the security headers on every
answer (the dashboard's files and the errors included), ``/readyz`` naming no actor to an
unsigned caller, and key ids that cannot be told apart from wrong signatures."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from actors.api.signing import sign
from actors.domain.api_keys import ApiKey
from actors.observability.endpoint import SECURITY_HEADERS
from runtime.version import __version__
from tests.api_node import ADMIN, ApiNode, plain_api_node, wait_until

ADMIN_KEY = ApiKey(ADMIN[0], ADMIN[1].encode())


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    with plain_api_node(redis_url, tmp_path_factory.mktemp("security"), "sec") as node:
        yield node


def now_ms() -> int:
    return int(time.time() * 1000)


def signed_get(api: ApiNode, path: str, key: ApiKey = ADMIN_KEY, **sign_args: Any) -> Any:
    headers = sign(key, "GET", path, b"", sign_args.pop("now_ms", now_ms()), **sign_args)
    return httpx.get(api.url + path, headers=headers)


def assert_hardened(response: httpx.Response) -> None:
    for name, expected in SECURITY_HEADERS.items():
        assert response.headers.get(name) == expected, (name, response.request.url)


@pytest.mark.parametrize(
    "path",
    [
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/metrics",
        "/v1/tasks",  # 401: unsigned
        "/no/such/route",  # 404
        "/dashboard/",
        "/dashboard/app.js",
        "/dashboard/core.js",
        "/dashboard/style.css",
        "/",  # the redirect to the dashboard
    ],
)
def test_every_answer_carries_the_security_headers(api: ApiNode, path: str) -> None:
    assert_hardened(httpx.get(api.url + path))


def test_a_signed_answer_and_a_refused_write_carry_them_too(api: ApiNode) -> None:
    ok = signed_get(api, "/v1/queues")
    assert ok.status_code == 200
    assert_hardened(ok)
    refused = httpx.post(api.url + "/v1/tasks", content=b"{}")
    assert refused.status_code == 401
    assert_hardened(refused)


def test_the_policy_forbids_inline_code_and_framing() -> None:
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in policy  # neither 'unsafe-inline' nor 'unsafe-eval'


def test_the_dashboard_page_has_no_inline_script_style_or_handler(api: ApiNode) -> None:
    html = httpx.get(api.url + "/dashboard/").text
    assert "<style" not in html and " style=" not in html
    # Scripts only from the dashboard's own files, none inline.
    scripts = re.findall(r'<script src="[a-z]+\.js"></script>', html)
    assert html.count("<script") == len(scripts) and '<script src="app.js"></script>' in scripts
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html)  # no onclick= and the like


def test_readyz_names_no_actor_to_an_unsigned_caller(api: ApiNode) -> None:
    ready = httpx.get(api.url + "/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "redis": True, "version": __version__}


def test_readyz_names_the_actors_down_to_a_signed_request(api: ApiNode) -> None:
    ready = signed_get(api, "/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "redis": True, "version": __version__, "actors_down": {}}


def test_a_readyz_signed_with_a_wrong_secret_gets_the_plain_answer(api: ApiNode) -> None:
    forged = signed_get(api, "/readyz", ApiKey(ADMIN[0], b"not-the-secret-at-all"))
    assert forged.status_code == 200  # a probe's status never depends on a signature
    assert forged.json() == {"ready": True, "redis": True, "version": __version__}


def test_an_unknown_key_is_answered_exactly_like_a_wrong_secret(api: ApiNode) -> None:
    unknown = signed_get(api, "/v1/queues", ApiKey("intruder", ADMIN[1].encode()))
    wrong = signed_get(api, "/v1/queues", ApiKey(ADMIN[0], b"not-the-secret-at-all"))
    assert unknown.status_code == wrong.status_code == 401
    assert unknown.json() == wrong.json()
    assert unknown.json()["code"] == "bad_signature"
    assert unknown.json()["detail"] == "signature or key not accepted"
    assert "intruder" not in unknown.text


def test_an_expired_request_says_skew_whether_or_not_the_key_exists(api: ApiNode) -> None:
    """The skew check comes before the key's: an old timestamp cannot probe for ids."""
    old = now_ms() - 3_600_000
    unknown = signed_get(api, "/v1/queues", ApiKey("intruder", ADMIN[1].encode()), now_ms=old)
    known = signed_get(api, "/v1/queues", now_ms=old)
    assert unknown.status_code == known.status_code == 401
    assert unknown.json() == known.json()
    assert known.json()["code"] == "skew"


def test_the_log_keeps_the_real_reason_of_a_refusal(api: ApiNode) -> None:
    key_id = f"probe{time.monotonic_ns()}"
    signed_get(api, "/v1/queues", ApiKey(key_id, ADMIN[1].encode()))
    signed_get(api, "/v1/tasks", ApiKey(ADMIN[0], b"not-the-secret-at-all"))

    def refusals() -> list[str]:
        return [str(e["refused"]) for e in api.node.events("api_request") if "refused" in e]

    wait_until(lambda: any(key_id in r for r in refusals()))
    wait_until(lambda: any("bad_signature" in r for r in refusals()))
    assert f"401 unknown_key: no key '{key_id}'" in refusals()
    wrong = [e for e in api.node.events("api_request") if "bad_signature" in e.get("refused", "")]
    assert wrong[0]["claimed_key"] == ADMIN[0] and wrong[0]["key"] is None
    assert ADMIN[1] not in "".join(api.node.raw)
