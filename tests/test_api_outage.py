"""The API when Redis goes away under it: clear 503s, never a 500 or a hang, and readiness
that says so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from actors.admin.client import ApiError, Client
from actors.store.keys import Keys
from runtime.embedded_redis import find_server_binary
from runtime.testing.local_redis import RedisProcess, free_port
from runtime.version import __version__
from tests.api_node import ADMIN, WORK_AND_DOOMED, api_node, wait_until, write_api_config


@pytest.fixture
def own_server() -> Iterator[RedisProcess]:
    server = RedisProcess(find_server_binary()).start()
    yield server
    server.remove()


def test_requests_get_503_while_redis_is_down_and_readyz_tells(
    own_server: RedisProcess, tmp_path: Path
) -> None:
    config = write_api_config(tmp_path / "node.toml", own_server.url, "outage")
    with api_node(config, "outage") as api, Client(api.url, *ADMIN, timeout_s=10) as client:
        client.create_task("idle", {"kind": "interval", "every_s": 3600}, None, "before")
        own_server.kill()
        started = time.monotonic()
        with pytest.raises(ApiError) as refused:
            client.get_task("before")
        assert (refused.value.status, refused.value.code) == (503, "redis_unavailable")
        assert time.monotonic() - started < 5  # refused at once, not after a hang
        ready = httpx.get(api.url + "/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["redis"] is False
        assert ready.json()["version"] == __version__  # a node not ready still says what it runs
        # Whatever the supervisors did meanwhile, nothing answered 500.
        assert not api.node.events("api_error")
        own_server.start(port=own_server.port)
        # Back: the node either recovers and serves again, or has given up meanwhile (exit
        # 1, for its service manager to restart it).
        wait_until(lambda: serving_again(api.url) or api.node.proc.poll() is not None, 20)


def test_a_node_started_while_redis_is_away_answers_at_once_and_fires_once_it_is_back(
    tmp_path: Path,
) -> None:
    """Redis not up when the node starts: its API answers at once (``/healthz`` 200,
    ``/readyz`` 503 naming Redis, a request that needs Redis a 503 ``redis_unavailable``),
    so an orchestrator's startup probe sees a live process instead of restarting it in a
    loop; once Redis is up the node reads its namespace, is ready, and fires."""
    server = RedisProcess(find_server_binary())
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    config = write_api_config(tmp_path / "node.toml", url, "late", consumers=WORK_AND_DOOMED)
    try:
        with api_node(config, "late") as api, Client(api.url, *ADMIN, timeout_s=10) as client:
            assert httpx.get(api.url + "/healthz", timeout=10).status_code == 200
            ready = httpx.get(api.url + "/readyz", timeout=10)
            assert ready.status_code == 503 and ready.json()["redis"] is False
            with pytest.raises(ApiError) as refused:
                client.get_task("any")
            assert (refused.value.status, refused.value.code) == (503, "redis_unavailable")
            server.start(port=port)
            wait_until(lambda: serving_again(api.url), 60)
            client.create_task("work", {"kind": "interval", "every_s": 1}, None, "soon")
            wait_until(lambda: any(e["task_id"] == "soon" for e in api.node.events("finished")), 60)
    finally:
        server.remove()


def serving_again(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_a_task_whose_key_redis_rejects_is_named_not_a_bare_500(
    own_server: RedisProcess, tmp_path: Path
) -> None:
    """The task's partition history key holds a string (data of another kind): reading the
    task is a 500 that says Redis rejected the read and why, not a crash that reveals
    nothing, and the node goes on serving the other tasks."""
    config = write_api_config(tmp_path / "node.toml", own_server.url, "rejects")
    with api_node(config, "rejects") as api, Client(api.url, *ADMIN, timeout_s=10) as client:
        client.create_task("idle", {"kind": "interval", "every_s": 3600}, None, "broken")
        raw = redis.Redis.from_url(own_server.url)
        keys = Keys("rejects", int(raw.hget("rejects:meta", "partitions") or 0))
        raw.set(keys.history(keys.partition_of("broken")), "not a hash")
        fine = next(
            t
            for t in (f"t{i}" for i in range(100))
            if keys.partition_of(t) != keys.partition_of("broken")
        )
        client.create_task("idle", {"kind": "interval", "every_s": 3600}, None, fine)
        with pytest.raises(ApiError) as rejected:
            client.get_task("broken")
        assert (rejected.value.status, rejected.value.code) == (500, "redis_rejected")
        assert "WRONGTYPE" in str(rejected.value)
        assert client.get_task(fine)["task_id"] == fine
        raw.close()
