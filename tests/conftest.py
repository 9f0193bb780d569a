"""Shared fixtures: a Redis the suite started itself, and a fresh namespace per test."""

from __future__ import annotations

import compileall
import io
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.admin.client import Client
from actors.store.keys import Keys
from runtime import logging as node_logging
from runtime.config import RedisSection
from runtime.redis_io import RedisClient
from tests import run_order
from tests.api_node import ADMIN, ApiNode
from tests.dashboard_browser import launch_browser, new_page
from tests.node_process import REPO
from tests.redis_server import redis_url_for_tests

#: What the node processes a test starts, and the test helpers, import from the repository.
SOURCES = ("actors", "runtime", "metronome", "bench", "tests")


def pytest_configure(config: pytest.Config) -> None:
    """Once a run, in the process that hands tests out (not in each xdist worker):
    check that xdist will group the tests, byte-compile the sources, and time the tests
    for the next run's order.

    A process reads ``__pycache__`` even where ``PYTHONDONTWRITEBYTECODE`` keeps it from
    writing there; without it, every node process a test starts compiles every module
    from source."""
    if hasattr(config, "workerinput"):
        return
    run_order.check_tools(config)
    for source in SOURCES:
        compileall.compile_dir(REPO / source, quiet=1, optimize=sys.flags.optimize)
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    if cache is not None:
        config.pluginmanager.register(run_order.Durations(cache), "metronome-durations")


@pytest.hookimpl(wrapper=True)
def pytest_collection() -> Generator[None, object, object]:
    """The test modules as pytest rewrote them (their asserts) kept in ``__pycache__``,
    whatever ``PYTHONDONTWRITEBYTECODE`` says: otherwise each xdist worker rewrites every
    one of them again, each run."""
    wrote = not sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = not wrote


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("loadgroup", False):  # an xdist worker under --dist loadgroup
        run_order.plan(config, items)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_url_for_tests() as url:
        yield url


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses: tests share one server but never each other's keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def db(redis_url: str) -> Iterator[Any]:
    """A plain (blocking) redis-py client on the suite's server, for tests that check what
    is in Redis from outside a trio run (tests of node processes and their API)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The JSON log lines this test wrote, as the node would write them to stdout."""
    buffer = io.StringIO()
    node_logging.configure(node="test", stream=buffer)
    yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    node_logging.configure(node="test")


@pytest.fixture
def debug_log_lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """``log_lines`` at the debug level: every step of every fire has its own line."""
    buffer = io.StringIO()
    node_logging.configure(node="test", stream=buffer, level="debug")
    yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    node_logging.configure(node="test")


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """A real Redis Cluster of three local processes, started by the suite."""
    from runtime.embedded_redis import find_server_binary
    from runtime.testing.local_redis import LocalCluster

    cluster = LocalCluster(find_server_binary()).start()
    try:
        yield cluster.url
    finally:
        cluster.remove()


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test handlers (``tests.handlers.jobs``) record each call, one JSON line
    per call; node processes the test starts inherit the variable."""
    path = tmp_path / "handled.jsonl"
    monkeypatch.setenv("METRONOME_TEST_RECORD", str(path))
    return path


# -- an API node's tests (each such module has a module-scoped ``api`` fixture) -------------


@pytest.fixture(scope="module")
def record_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the test handlers of a module's shared node record each call."""
    return tmp_path_factory.mktemp("record") / "handled.jsonl"


@pytest.fixture
def client(api: ApiNode) -> Iterator[Client]:
    """A signing client (the admin key) of the module's ``api`` node."""
    with Client(api.url, *ADMIN) as c:
        yield c


@pytest.fixture
def keys(api: ApiNode) -> Keys:
    """The key layout of the module's ``api`` node's namespace."""
    return Keys(api.namespace, 16)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per dashboard test module (``tests/dashboard_browser.py``)."""
    with launch_browser() as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context a test: no storage, no cookies."""
    with new_page(browser) as fresh:
        yield fresh
