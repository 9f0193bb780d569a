"""Pipelined Redis calls on trio sockets, parsed by hiredis: the fire path without a thread.

Why: every call through ``runtime.io_threads`` crosses to a worker thread and back (tens of
microseconds of node CPU, and the GIL handed to and fro); the scheduler's and consumers'
calls (claims, enqueues, stream reads, outcomes) are most of a node's calls. A plain TCP or
Unix-socket connection (``redis://``, ``unix://``) needs nothing a trio socket lacks, so
those calls run here, on the trio thread (``[redis] native_io``); TLS, Sentinel and
Cluster connections, and every other call, stay on redis-py through the I/O threads.

A ``NativePool`` speaks to one server exactly as redis-py's connection does for these
calls: the same handshake (``HELLO`` with the protocol and credentials, ``SELECT`` when
the database is not 0), hiredis's parser with redis-py's error classes, so the replies are
the ones ``runtime.redis_wire`` reads from redis-py's connection, error replies returned in
place. At most ``max_connections`` calls run at once; more wait in order.

Failures: a connection that cannot be made, breaks, or stays silent for the socket timeout
raises ``redis.exceptions.ConnectionError`` / ``TimeoutError`` (the client maps them as it
does redis-py's); the connection is dropped. A call that fails on a connection reused
from the pool before a byte of its reply came is sent once more on a new connection (a
server restarted while the connection idled), as redis-py's retry does.

Cancellation is prompt. A call cancelled after its commands were (partly) sent is
*abandoned*: its connection is half-closed and kept until ``wait_abandoned`` has read to
its end. The server runs the commands it has read, drops any it had not started (a
paused server's) and then closes the connection: once it has, the call has run or never
will, so a caller's next step cannot race a write it gave up on (as with
``IOThreads.wait_abandoned``).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.exceptions
import trio
from redis._parsers.base import BaseParser

from runtime.config import RedisSection

Reply = Any

_READ_SIZE = 65536
#: A sentinel hiredis returns while a reply is incomplete.
_MORE = object()


class _Connection:
    __slots__ = ("reader", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:  # a Unix socket's too
        self.stream = stream
        self.reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_MORE,
        )

    async def read_reply(self, timeout_s: float) -> Reply:
        reader = self.reader
        reply = reader.gets()
        while reply is _MORE:
            with trio.move_on_after(timeout_s) as scope:
                data = await self.stream.receive_some(_READ_SIZE)
            if scope.cancelled_caught:
                raise redis.exceptions.TimeoutError("Timeout reading from socket")
            if not data:
                raise redis.exceptions.ConnectionError("Connection closed by server.")
            reader.feed(data)
            reply = reader.gets()
        if isinstance(reply, redis.exceptions.InvalidResponse):
            raise redis.exceptions.ConnectionError(f"protocol error: {reply}")
        return reply


class NativePool:
    """Pipelined calls to one Redis server over trio sockets (see the module's docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        protocol: int = 3,
        socket_timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 16,
    ) -> None:
        self.host, self.port, self.path, self.db = host, port, path, db
        self.address = path or f"{host}:{port}"
        self._username, self._password, self._protocol = username, password, protocol
        self._timeout_s = socket_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._abandoned: list[_Connection] = []
        """Half-closed connections of abandoned calls, not yet read to their end."""
        self._max_abandoned = max_connections

    @classmethod
    def beside(cls, pool: Any, settings: RedisSection) -> NativePool | None:
        """A pool to the server of redis-py's ``pool`` when it is a plain TCP or Unix-socket
        one (None for any other kind of connection)."""
        kwargs = pool.connection_kwargs
        if pool.connection_class not in (redis.Connection, redis.UnixDomainSocketConnection):
            return None
        return cls(
            kwargs.get("host", "localhost"),
            int(kwargs.get("port", 6379)),
            path=kwargs.get("path"),
            db=int(kwargs.get("db") or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            protocol=int(kwargs.get("protocol") or 3),
            socket_timeout_s=settings.socket_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            max_connections=settings.max_connections,
        )

    async def one(self, command: Sequence[Any]) -> Reply:
        """One command; an error reply raised, as redis-py does."""
        (reply,) = await self.pipelined(pack([command]), 1)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    async def pipelined(self, packed: bytes, count: int) -> list[Reply]:
        """``count`` commands, already packed (``pack``), sent at once; their replies in
        order, an error reply in place as its exception."""
        async with self._slots:
            if self._idle:
                try:
                    return await self._on(self._idle.pop(), packed, count)
                except _StaleConnection:
                    # The server closed the idle connection (restarted, or dropped idle
                    # clients) before any reply: the commands go once more on a new one.
                    pass
            try:
                return await self._on(await self._connect(), packed, count)
            except _StaleConnection as exc:
                raise exc.error from None

    async def _on(self, conn: _Connection, packed: bytes, count: int) -> list[Reply]:
        replies = await self._exchange(conn, packed, count)
        self._idle.append(conn)
        return replies

    async def _exchange(self, conn: _Connection, packed: bytes, count: int) -> list[Reply]:
        """Send, read ``count`` replies; on any failure the connection is dropped (or,
        cancelled, abandoned) and not returned to the pool."""
        replies: list[Reply] = []
        try:
            await conn.stream.send_all(packed)
            for _ in range(count):
                replies.append(await conn.read_reply(self._timeout_s))
        except trio.Cancelled:
            self._abandon(conn)
            raise
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._drop(conn)
            error = redis.exceptions.ConnectionError(f"Error on the connection: {exc!r}")
            if not replies:
                raise _StaleConnection(error) from exc
            raise error from exc
        except redis.exceptions.ConnectionError as exc:  # closed by the server
            await self._drop(conn)
            if not replies:
                raise _StaleConnection(exc) from exc
            raise
        except BaseException:  # a timeout, a protocol error
            await self._drop(conn)
            raise
        return replies

    async def _connect(self) -> _Connection:
        try:
            stream: Any
            with trio.fail_after(self._connect_timeout_s):
                if self.path is not None:
                    stream = await trio.open_unix_socket(self.path)
                else:
                    stream = await trio.open_tcp_stream(self.host, self.port)
        except trio.TooSlowError as exc:
            raise redis.exceptions.TimeoutError(f"Timeout connecting to {self.address}") from exc
        except OSError as exc:
            raise redis.exceptions.ConnectionError(
                f"Error connecting to {self.address}: {exc}"
            ) from exc
        conn = _Connection(stream)
        hello: list[Any] = ["HELLO", self._protocol]
        if self._password is not None:
            hello += ["AUTH", self._username or "default", self._password]
        commands = [hello] + ([["SELECT", self.db]] if self.db else [])
        try:
            replies = await self._exchange(conn, pack(commands), len(commands))
        except _StaleConnection as exc:
            raise exc.error from None
        for reply in replies:
            if isinstance(reply, redis.exceptions.ResponseError):
                await self._drop(conn)
                raise reply
        return conn

    def _abandon(self, conn: _Connection) -> None:
        with contextlib.suppress(OSError):
            conn.stream.socket.shutdown(socket.SHUT_WR)  # the server reads to here, then ends
        self._abandoned.append(conn)
        if len(self._abandoned) > self._max_abandoned:
            # Nobody waited for these (callers that do, wait soon): the oldest has long
            # been ended by the server; its socket is closed rather than kept.
            self._abandoned.pop(0).stream.socket.close()

    async def _drop(self, conn: _Connection) -> None:
        with trio.CancelScope(shield=True):
            await conn.stream.aclose()

    async def wait_abandoned(self) -> None:
        """Until the server has ended every abandoned call's connection (each bounded by
        the socket timeout): each of their commands has run by then, or never will."""
        while self._abandoned:
            conn = self._abandoned[-1]
            with trio.move_on_after(self._timeout_s):
                with contextlib.suppress(OSError, trio.BrokenResourceError):
                    while await conn.stream.receive_some(_READ_SIZE):
                        pass
            self._abandoned.pop()
            await self._drop(conn)

    async def aclose(self) -> None:
        """Close every connection (abandoned ones without waiting)."""
        conns, self._idle = self._idle + self._abandoned, []
        self._abandoned = []
        for conn in conns:
            await self._drop(conn)


class _StaleConnection(Exception):
    """A call failed before any reply came: ``error`` is what to raise if not retried."""

    def __init__(self, error: redis.exceptions.ConnectionError) -> None:
        super().__init__(str(error))
        self.error = error


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """Commands packed for one send: hiredis packs each in C; an argument it does not take
    (a bytearray) goes redis-py's way, which converts it or raises ``DataError``."""
    try:
        return b"".join([hiredis.pack_command(tuple(command)) for command in commands])
    except TypeError:
        return b"".join(_FALLBACK.pack_commands(commands))  # type: ignore[no-untyped-call]


#: An unconnected redis-py connection: its packer, for arguments hiredis does not take.
_FALLBACK = redis.Connection()  # type: ignore[no-untyped-call]
