"""Pipelined Redis calls on trio sockets, parsed by hiredis: the fire path without a thread.

Why: every call through ``runtime.io_threads`` crosses to a worker thread and back (tens of
microseconds of node CPU, and the GIL handed to and fro); the scheduler's and consumers'
calls (claims, enqueues, stream reads, outcomes) are most of a node's calls. A plain TCP or
Unix-socket connection (``redis://``, ``unix://``) needs nothing a trio socket lacks, so
those calls run here, on the trio thread (``[redis] native_io``), one pool a server (a
Cluster's masters: ``runtime.redis_cluster_native``); TLS and Sentinel connections, and
every other call, stay on redis-py through the I/O threads.

A ``NativePool`` speaks to one server exactly as redis-py's connection does for these
calls: the same handshake (``HELLO`` with the protocol and credentials, ``SELECT`` when
the database is not 0), hiredis's parser with redis-py's error classes, so the replies are
the ones ``runtime.redis_wire`` reads from redis-py's connection, error replies returned in
place. At most ``max_connections`` calls run at once; more wait in order.

Failures: a connection that cannot be made, breaks, stays silent for the socket timeout, or
takes longer than it to take a call's bytes (a server that stopped reading) raises
``redis.exceptions.ConnectionError`` / ``TimeoutError`` (the client maps them as it does
redis-py's); the connection is dropped. An error reply redis-py raises rather than
returns (``LOADING``, ``NOAUTH``, ``WRONGPASS``: its ``ConnectionError`` kinds) is raised
likewise, after the call's other replies were read. A call is never sent twice: as redis-py
checks a pooled connection before it sends, an idle connection the server has closed (a
restart, an idle timeout) is found before use (nothing to read on it, or it is dropped).

Cancellation is prompt. A call cancelled after its commands were (partly) sent is
*abandoned*: its connection is half-closed and kept until ``wait_abandoned`` has read to
its end. The server runs the commands it has read, drops any it had not started (a
paused server's) and then closes the connection: once it has, the call has run or never
will, so a caller's next step cannot race a write it gave up on (as with
``IOThreads.wait_abandoned``). ``wait_abandoned`` says whether every one ended so; one
still open after the socket timeout (a server paused that long) is closed and reported.
"""

from __future__ import annotations

import contextlib
import select
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
#: The most of a call sent under one socket timeout (``NativePool._send``).
_SEND_SLICE = 1 << 20
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
        while True:
            try:
                reply = reader.gets()
            except redis.exceptions.InvalidResponse as exc:  # not Redis speaking
                raise redis.exceptions.ConnectionError(f"protocol error: {exc}") from exc
            if reply is _MORE:
                with trio.move_on_after(timeout_s) as scope:
                    data = await self.stream.receive_some(_READ_SIZE)
                if scope.cancelled_caught:
                    raise redis.exceptions.TimeoutError("Timeout reading from socket")
                if not data:
                    raise redis.exceptions.ConnectionError("Connection closed by server.")
                reader.feed(data)
            elif type(reply) is not hiredis.PushNotification:  # none is asked for; skipped
                return reply

    def closed_while_idle(self) -> bool:
        """Whether anything is readable on an idle connection: the server's end of it (a
        restart, an idle timeout) or bytes nobody asked for; either way it is not reused."""
        poll = select.poll()
        poll.register(self.stream.socket.fileno(), select.POLLIN)
        return bool(poll.poll(0))


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
        client_name: str | None = None,
        socket_timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 16,
    ) -> None:
        self.host, self.port, self.path, self.db = host, port, path, db
        self.address = path or f"{host}:{port}"
        self._username, self._password, self._protocol = username, password, protocol
        self._client_name = client_name
        self._timeout_s = socket_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._abandoned: list[_Connection] = []
        """Half-closed connections of abandoned calls, not yet read to their end."""
        self._max_abandoned = max_connections
        self._waiting = trio.Lock()
        """Held by a ``wait_abandoned``: one reader at a time of each connection."""

    @classmethod
    def beside(
        cls, pool: Any, settings: RedisSection, address: tuple[str, int] | None = None
    ) -> NativePool | None:
        """A pool to the server of redis-py's ``pool`` when it is a plain TCP or Unix-socket
        one (None for any other kind of connection); ``address``: to another server with
        the same credentials (a cluster's other masters)."""
        kwargs = pool.connection_kwargs
        if pool.connection_class not in (redis.Connection, redis.UnixDomainSocketConnection):
            return None
        host, port = address or (kwargs.get("host", "localhost"), int(kwargs.get("port", 6379)))
        return cls(
            host,
            port,
            path=kwargs.get("path"),
            db=int(kwargs.get("db") or 0),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            protocol=int(kwargs.get("protocol") or 3),
            client_name=kwargs.get("client_name"),
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
        order, an error reply in place as its exception (but those redis-py raises)."""
        conn = await self._checkout()
        kept = None
        try:
            replies = await self._exchange(conn, packed, count)
            kept = conn
            return replies
        finally:
            self._checkin(kept)

    async def _checkout(self) -> _Connection:
        """A connection of this pool's own, within ``max_connections``: an idle one the
        server has not closed, or a new one. Hand it back with ``_checkin``."""
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed_while_idle():
                    return conn
                await self._drop(conn)
            return await self._connect()
        except BaseException:
            self._slots.release()
            raise

    def _checkin(self, conn: _Connection | None) -> None:
        """Back from ``_checkout``: ``conn`` to be used again, or None (dropped or
        abandoned)."""
        if conn is not None:
            self._idle.append(conn)
        self._slots.release()

    async def _exchange(self, conn: _Connection, packed: bytes, count: int) -> list[Reply]:
        """Send, read ``count`` replies; on any failure the connection is dropped (or,
        cancelled, abandoned) and not returned to the pool."""
        try:
            await self._send(conn, packed)
            return await self._receive(conn, count)
        except trio.Cancelled:
            self._abandon(conn)
            raise
        except BaseException:  # closed by the server, a timeout, a protocol error
            await self._drop(conn)
            raise

    async def _send(self, conn: _Connection, packed: bytes) -> None:
        """All of ``packed``, each ``_SEND_SLICE`` of it within the socket timeout: a
        server that stops reading (paused, stopped, its network gone silent) fills the
        socket's buffers, and a call larger than they are would wait for it for good, no
        outage ever said; a large call to a server that reads slowly still goes through
        (it is not timed out as a whole). Timed out, its commands may have run in part: the
        caller drops the connection, as for a silent read."""
        view = memoryview(packed)
        for start in range(0, len(view), _SEND_SLICE):
            with trio.move_on_after(self._timeout_s) as scope:
                try:
                    await conn.stream.send_all(view[start : start + _SEND_SLICE])
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise redis.exceptions.ConnectionError(
                        f"Error on the connection: {exc!r}"
                    ) from exc
            if scope.cancelled_caught:
                raise redis.exceptions.TimeoutError("Timeout writing to socket")

    async def _receive(
        self, conn: _Connection, count: int, timeout_s: float | None = None
    ) -> list[Reply]:
        """``count`` replies, each read with ``timeout_s`` of silence at most (the pool's
        socket timeout unless given)."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        replies: list[Reply] = []
        try:
            for _ in range(count):
                replies.append(await conn.read_reply(timeout))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise redis.exceptions.ConnectionError(f"Error on the connection: {exc!r}") from exc
        for reply in replies:
            # LOADING, NOAUTH, max clients: redis-py raises these (and drops the connection)
            if isinstance(reply, redis.exceptions.ConnectionError):
                raise reply
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
        commands = [hello]
        if self._client_name:
            commands.append(["CLIENT", "SETNAME", self._client_name])
        if self.db:
            commands.append(["SELECT", self.db])
        for reply in await self._exchange(conn, pack(commands), len(commands)):
            if isinstance(reply, Exception):  # the connection is not the one asked for
                await self._drop(conn)
                raise reply
        return conn

    def _abandon(self, conn: _Connection) -> None:
        with contextlib.suppress(OSError):
            conn.stream.socket.shutdown(socket.SHUT_WR)  # the server reads to here, then ends
        self._abandoned.append(conn)
        if len(self._abandoned) > self._max_abandoned:
            # Nobody waited for these (callers that do, wait soon): the oldest is closed
            # rather than kept, and what it sent is no longer waited for.
            self._abandoned.pop(0).stream.socket.close()

    async def _drop(self, conn: _Connection) -> None:
        with trio.CancelScope(shield=True):
            await conn.stream.aclose()

    async def wait_abandoned(self) -> bool:
        """Until the server has ended every abandoned call's connection, each waited for up
        to the socket timeout: True when each did (its commands have run, or never will);
        False when one was still open then, or was closed unread as the oldest of too many
        (what it sent may yet run)."""
        settled = True
        async with self._waiting:
            while self._abandoned:
                conn = self._abandoned[0]
                ended = False
                with (
                    contextlib.suppress(trio.ClosedResourceError),  # closed as the oldest
                    trio.move_on_after(self._timeout_s),
                ):
                    with contextlib.suppress(OSError, trio.BrokenResourceError):  # a reset
                        while await conn.stream.receive_some(_READ_SIZE):
                            pass
                    ended = True
                settled = settled and ended
                if conn in self._abandoned:  # not closed meanwhile as the oldest
                    self._abandoned.remove(conn)
                await self._drop(conn)
        return settled

    async def close_idle(self) -> None:
        """Close the connections no call is using."""
        conns, self._idle = self._idle, []
        for conn in conns:
            await self._drop(conn)

    async def aclose(self) -> None:
        """Close every connection (abandoned ones without waiting)."""
        conns, self._idle = self._idle + self._abandoned, []
        self._abandoned = []
        for conn in conns:
            await self._drop(conn)


def pack(commands: Sequence[Sequence[Any]]) -> bytes:
    """Commands packed for one send: hiredis packs each in C; an argument it does not take
    (a bytearray) goes redis-py's way, which converts it or raises ``DataError``."""
    try:
        return b"".join([hiredis.pack_command(tuple(command)) for command in commands])
    except TypeError:
        return b"".join(_FALLBACK.pack_commands(commands))  # type: ignore[no-untyped-call]


#: An unconnected redis-py connection: its packer, for arguments hiredis does not take.
_FALLBACK = redis.Connection()  # type: ignore[no-untyped-call]


async def pipelined_on_many(jobs: Sequence[tuple[NativePool, bytes, int]]) -> list[list[Reply]]:
    """``pipelined_on_each`` that stops at the first server that fails, and raises: the
    other jobs' connections are dropped unread (their parts may have run)."""
    return await pipelined_on_each(jobs, each=False)  # type: ignore[return-value]


async def pipelined_on_each(
    jobs: Sequence[tuple[NativePool, bytes, int]], *, each: bool = True
) -> list[list[Reply] | Exception]:
    """Each job's ``count`` packed commands on its pool's server, as ``pipelined`` does;
    a connection for every job is taken first, so a server that cannot be reached fails
    the call before anything is sent to any; then every job is sent before any reply is
    read, so the servers work at once.

    A job whose server fails once sent (a closed connection, a timeout, a reply redis-py
    raises) gets that error in place of its replies, and its connection is dropped; the
    other jobs' replies are still read, so a caller knows which of their writes ran.
    Once one server was silent for the socket timeout, the others, which have had as
    long, are each given ``_AFTER_SILENCE_S`` of silence at most (the timeout if less; a
    job cut off there is unknown, never taken as failed): a call with every server silent
    takes about one socket timeout, not one a server. A cancellation abandons the
    connections sent on and not read to the end (those that failed are dropped); the
    others go back to their pools."""
    # One order for every caller: no two callers wait on each other's connection slots.
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0].address)
    conns: dict[int, _Connection] = {}
    try:
        for i in order:
            conns[i] = await jobs[i][0]._checkout()
    except BaseException:
        for i, conn in conns.items():
            jobs[i][0]._checkin(conn)
        raise
    sent: set[int] = set()
    done: dict[int, list[Reply]] = {}
    failed: dict[int, Exception] = {}
    cancelled = False
    try:
        for i in order:
            sent.add(i)  # from the first byte on, its commands may run
            try:
                await jobs[i][0]._send(conns[i], jobs[i][1])
            except SERVER_LOST as exc:
                if not each:
                    raise
                failed[i] = exc
        timeout_s: float | None = None
        for i in order:
            if i in failed:
                continue
            try:
                done[i] = await jobs[i][0]._receive(conns[i], jobs[i][2], timeout_s)
            except SERVER_LOST as exc:
                if not each:
                    raise
                failed[i] = exc
                if isinstance(exc, redis.exceptions.TimeoutError):
                    timeout_s = min(_AFTER_SILENCE_S, jobs[i][0]._timeout_s)
    except trio.Cancelled:
        cancelled = True
        raise
    finally:
        for i in order:
            pool, conn = jobs[i][0], conns[i]
            if i in done or i not in sent:
                pool._checkin(conn)
                continue
            if cancelled and i not in failed:
                pool._abandon(conn)
            else:
                await pool._drop(conn)
            pool._checkin(None)
    return [done[i] if i in done else failed[i] for i in range(len(jobs))]


#: How long a server may stay silent, in ``pipelined_on_each``, once another server of the
#: same call was silent for the whole socket timeout.
_AFTER_SILENCE_S = 0.25

#: What a server lost mid-call raises (or leaves in a reply list): its replies are unknown.
SERVER_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
