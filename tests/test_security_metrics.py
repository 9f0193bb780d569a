"""Who may read ``/metrics``: ``[metrics] allow`` (client networks) and ``[metrics]
token_env`` (a bearer token), on the API and on the ``[metrics] bind`` listener of real
nodes; a signed API request passes both. And the config errors that name the key."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest

from actors.api.signing import sign
from actors.config import Config, MetricsSection
from actors.domain.api_keys import ApiKey
from actors.observability.endpoint import SECURITY_HEADERS, ScrapeGate
from runtime.config import structure
from runtime.errors import ConfigError
from tests.api_node import ADMIN, api_node, write_api_config

TOKEN = "scrape-token-0123456789abcdef"
TOKEN_ENV = "TEST_METRICS_TOKEN"
ADMIN_KEY = ApiKey(ADMIN[0], ADMIN[1].encode())


@attrs.frozen
class Node:
    """Where a node serves /metrics: on its API and on its own listener."""

    api: str
    listener: str


@contextlib.contextmanager
def metrics_node(redis_url: str, workdir: Path, metrics: str) -> Iterator[Node]:
    """A node with an API and a ``[metrics] bind`` listener; ``metrics`` adds to the
    ``[metrics]`` section."""
    namespace = f"scrape{time.monotonic_ns() % 10**9}"
    config = write_api_config(workdir / "node.toml", redis_url, namespace)
    config.write_text(config.read_text() + f'[metrics]\nbind = "127.0.0.1:0"\n{metrics}\n')
    with api_node(config, namespace, env={TOKEN_ENV: TOKEN}) as api:
        (listening,) = api.node.wait_for("metrics_listening")
        yield Node(api.url + "/metrics", listening["urls"][0] + "/metrics")


@pytest.fixture(scope="module")
def with_token(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node whose scrapes need the token and come from loopback."""
    metrics = f'token_env = "{TOKEN_ENV}"\nallow = ["127.0.0.0/8", "::1/128"]'
    with metrics_node(redis_url, tmp_path_factory.mktemp("token"), metrics) as node:
        yield node


@pytest.fixture(scope="module")
def elsewhere(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node that lets only 10.0.0.0/8 scrape: the tests' loopback client is outside."""
    metrics = 'allow = ["10.0.0.0/8"]'
    with metrics_node(redis_url, tmp_path_factory.mktemp("allow"), metrics) as node:
        yield node


def signed(path: str = "/metrics") -> dict[str, str]:
    return sign(ADMIN_KEY, "GET", path, b"", int(time.time() * 1000))


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code
    assert "metronome_" not in response.text
    assert TOKEN not in response.text
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value


def served(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    assert "metronome_redis_up" in response.text
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value


# -- the token --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["api", "listener"])
def test_a_scrape_without_the_token_is_refused_with_401(with_token: Node, where: str) -> None:
    url = getattr(with_token, where)
    answer = httpx.get(url)
    refused(answer, 401, "bad_token")
    assert answer.headers["www-authenticate"] == "Bearer"
    refused(httpx.get(url, headers={"Authorization": "Bearer not-the-token"}), 401, "bad_token")
    refused(httpx.get(url, headers={"Authorization": f"Basic {TOKEN}"}), 401, "bad_token")
    refused(httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}x"}), 401, "bad_token")


@pytest.mark.parametrize("where", ["api", "listener"])
def test_a_scrape_with_the_token_is_served(with_token: Node, where: str) -> None:
    served(httpx.get(getattr(with_token, where), headers={"Authorization": f"Bearer {TOKEN}"}))


def test_a_signed_request_needs_no_token_on_the_api(with_token: Node) -> None:
    served(httpx.get(with_token.api, headers=signed()))


def test_a_badly_signed_request_still_needs_the_token(with_token: Node) -> None:
    forged = sign(ApiKey(ADMIN[0], b"not-the-secret-at-all"), "GET", "/metrics", b"",
                  int(time.time() * 1000))  # fmt: skip
    refused(httpx.get(with_token.api, headers=forged), 401, "bad_token")


def test_the_listener_knows_no_api_keys(with_token: Node) -> None:
    refused(httpx.get(with_token.listener, headers=signed()), 401, "bad_token")
    other = httpx.get(with_token.listener.removesuffix("/metrics") + "/readyz")
    refused(other, 404, "no_route")


# -- the allow-list ---------------------------------------------------------------------


@pytest.mark.parametrize("where", ["api", "listener"])
def test_a_client_outside_the_allowed_networks_gets_403(elsewhere: Node, where: str) -> None:
    refused(httpx.get(getattr(elsewhere, where)), 403, "forbidden")


def test_a_signed_request_passes_the_allow_list_on_the_api(elsewhere: Node) -> None:
    served(httpx.get(elsewhere.api, headers=signed()))


def test_the_probes_are_not_behind_the_allow_list(elsewhere: Node) -> None:
    base = elsewhere.api.removesuffix("/metrics")
    assert httpx.get(base + "/healthz").status_code == 200
    assert httpx.get(base + "/readyz").status_code == 200


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("::ffff:10.1.2.3", True),  # an IPv4 client seen by a dual-stack listener
        ("fd00::7", True),
        ("192.168.1.1", False),
        ("::1", False),
        ("fe80::1", False),
        (None, False),  # a Unix socket's peer
        ("testclient", False),
    ],
)
def test_the_allow_list_matches_the_client_address(host: str | None, allowed: bool) -> None:
    gate = ScrapeGate(MetricsSection(allow=["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]))
    assert gate.allows(host) is allowed


# -- config -----------------------------------------------------------------------------


def load_metrics(section: dict[str, object]) -> MetricsSection:
    return structure({"metrics": section}, Config, "node.toml").metrics


@pytest.mark.parametrize("network", ["10.0.0.300/8", "10.0.0.1/8", "ten", "10.0.0.0/33"])
def test_a_bad_network_is_a_config_error_naming_the_key(network: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_metrics({"allow": ["127.0.0.1/32", network]})
    assert f"metrics.allow: {network!r} is not a network in CIDR form" in str(info.value)


@pytest.mark.parametrize("value", [None, "", " \n"])
def test_a_token_env_naming_an_unset_variable_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    """Unset, empty or white space only (an empty secret file's newline): no token, so a
    config error, never a gate that takes an empty bearer token."""
    monkeypatch.delenv("TEST_NO_SUCH_TOKEN", raising=False)
    if value is not None:
        monkeypatch.setenv("TEST_NO_SUCH_TOKEN", value)
    with pytest.raises(ConfigError) as info:
        load_metrics({"token_env": "TEST_NO_SUCH_TOKEN"})
    assert "metrics.token_env: environment variable TEST_NO_SUCH_TOKEN is not set" in str(
        info.value
    )


def test_a_token_env_naming_a_set_variable_gives_the_gate_its_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_SOME_TOKEN", TOKEN + "\n")  # a file-based secret's newline
    section = load_metrics({"token_env": "TEST_SOME_TOKEN", "allow": ["192.0.2.0/24"]})
    assert section.token() == TOKEN
    assert TOKEN not in repr(section)
    gate = ScrapeGate(section)
    assert gate.token == TOKEN.encode() and gate.allows("192.0.2.9")
