"""All Redis I/O: redis-py, driven from trio through a bounded pool of worker threads, and
the fire path's calls on trio sockets where the connection allows.

Why threads: redis-py (the client the design names) has no trio support, and its asyncio
client cannot run on trio. So its calls leave the trio thread:

- a fixed set of ``max_connections`` worker threads (``runtime.io_threads``, cheaper per call
  than ``trio.to_thread``) matches the blocking connection pool, so a burst queues instead of
  opening sockets without end;
- every socket has a timeout, so a thread never blocks forever; calls are *abandoned* on
  cancellation, so cancelling an actor is prompt even while its thread still waits for the
  socket timeout;
- work is batched (Lua scripts, pipelines): the ~tens of microseconds a thread hop costs are
  paid per batch, not per task.

Connection loss and timeouts surface as ``RedisUnavailable`` (never a hang), and mark the
client unreachable: one ``redis_unreachable`` line when an outage begins, one
``redis_reachable`` (with its length) when a call gets through again. Every error reply is
classified once (``runtime.redis_replies``): a transient one (loading, busy, failing over)
is an outage like the others; a refused one (writes refused, a permission missing, a
command rejected) is ``RedisRefused``. Actors crash on neither: ``ride_out`` waits
(probing with capped, jittered backoff, cancellably) and repeats their step once Redis
answers, or, after a refusal, once a backoff has passed (``redis_refused`` when refusals
begin, ``redis_accepting`` when a refused step goes through).

Scripts are called by SHA; on NOSCRIPT (a restarted or failed-over server) the source is sent
once with EVAL, which also caches it on that server (and on the right shard in a cluster).

Every Redis call of a node's work goes through this module (``embedded_redis`` only pings
the server it started; ``runtime.testing`` is the test kit), and above it only
``actors.store`` builds commands or reads replies: a native async client can replace it.

The fire path's calls (pipelined scripts, stream reads) skip the hop on a plain TCP or
Unix-socket connection: ``runtime.redis_native`` sends them on trio sockets with hiredis
parsing, replies and errors as redis-py's (``[redis] native_io``, default on); on a Cluster,
``runtime.redis_cluster_native`` sends each to the master of its slot.

``RedisClient`` is composed of five parts: the direct-connection script calls of the fire
path (``runtime.redis_wire``), their trio-socket pool (``runtime.redis_native``) and its
Cluster routing (``runtime.redis_cluster_native``), riding out outages and refusals
(``runtime.redis_outages``), and building the redis-py client (``runtime.redis_connect``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster
import redis.exceptions
import trio

from runtime.config import SENTINEL_SCHEMES, RedisSection, redact
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.io_threads import IOThreads
from runtime.logging import get_logger
from runtime.redis_cluster_native import ClusterCalls, ClusterRoutes
from runtime.redis_connect import check_url_options, sentinel_master, tls_options
from runtime.redis_native import NativePool
from runtime.redis_outages import OutageRiding
from runtime.redis_replies import classify
from runtime.redis_wire import DirectCalls, NoScriptError, in_order, raise_outage
from runtime.redis_wire import Reply as Reply
from runtime.redis_wire import Script as Script

T = TypeVar("T")

ResponseError = redis.exceptions.ResponseError

#: Longest wait in ``aclose`` for calls still running on the I/O threads.
_CLOSE_WAIT_S = 6.0
#: redis-py's cluster errors that clear up once the cluster does (none of its nodes could
#: be reached, a slot without a master); its others are mistakes, not outages.
_CLUSTER_UNAVAILABLE: tuple[type[Exception], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in ("ClusterDownError", "RedisClusterUnreachableError", "SlotNotCoveredError")
    if hasattr(redis.exceptions, name)
)


class RedisClient(DirectCalls, ClusterCalls, OutageRiding):
    """The async face of one redis-py client (standalone or cluster)."""

    def __init__(
        self,
        raw: Any,
        max_connections: int,
        description: str,
        *,
        connect: Callable[[], Any] | None = None,
        native: NativePool | None = None,
        routes: ClusterRoutes | None = None,
    ) -> None:
        """``raw``: the redis-py client; or None and ``connect``, which builds it at the
        first call (a cluster client connects as it is built: this way a node starting
        while its cluster is unreachable waits for it like for any outage). ``native``:
        the same server's trio-socket pool, for the fire path's calls; ``routes``: a
        Cluster's, to its masters (``runtime.redis_cluster_native``)."""
        self._raw_client = raw
        self._native = native
        self._routes = routes
        self._connect = connect
        self._connect_lock = threading.Lock()
        self._threads = IOThreads(max_connections)
        self.description = description
        self.is_cluster = connect is not None or isinstance(raw, redis.cluster.RedisCluster)
        self._clock: tuple[float, int] | None = None  # (local monotonic s, Redis ms) at reading
        self._down_since: float | None = None
        """Monotonic time of the first failed call of the current outage; None: reachable."""
        self._replica_seen = False
        """A call met ``READONLY`` (``DirectCalls._classified`` notes it in place): the
        server behind the URL is a replica now, and the next call connects anew
        (``_connect_anew``)."""
        self._refused: RedisRefused | None = None
        """The refusal that began the current run of refused steps; None: none."""
        self._refused_steps = 0
        """Steps waiting to be repeated after a refusal right now (``ride_out``)."""
        self._refused_since = 0.0
        """Monotonic time the current run of refusals began."""
        self.disruptions: collections.deque[tuple[float, float]] = collections.deque(maxlen=64)
        """The latest outages and runs of refusals, (monotonic end, seconds long): a
        claimer waits a lease after one long enough before taking over other consumers'
        messages, whose renewals could not get through meanwhile
        (``OutageRiding.last_ended``: a short one after it does not end that wait)."""
        self._log = get_logger(actor="redis")

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_settings(cls, url: str, settings: RedisSection) -> RedisClient:
        """Build a client for ``url`` (``settings.url`` resolved: never ``embedded``)."""
        common: dict[str, Any] = {
            "username": settings.username,
            "password": settings.resolved_password(),
            "socket_timeout": settings.socket_timeout_s,
            "socket_connect_timeout": settings.connect_timeout_s,
            "health_check_interval": 0,
        }
        if url.startswith(("rediss://", "rediss+sentinel://")):
            common.update(tls_options(settings))
        if not url.startswith(SENTINEL_SCHEMES):
            check_url_options(url)
        if url.startswith(SENTINEL_SCHEMES):
            raw: Any = sentinel_master(url, settings, common)
        elif settings.cluster:
            return cls(
                None,
                settings.max_connections,
                redact(url),
                connect=lambda: redis.cluster.RedisCluster.from_url(
                    url, max_connections=settings.max_connections, **common
                ),
                routes=(
                    ClusterRoutes(settings)
                    if settings.native_io and not url.startswith("rediss://")
                    else None
                ),
            )
        else:
            pool = redis.BlockingConnectionPool.from_url(
                url,
                max_connections=settings.max_connections,
                timeout=settings.socket_timeout_s,
                **common,
            )
            raw = redis.Redis(connection_pool=pool)
            if settings.native_io and not url.startswith("rediss://"):
                return cls(
                    raw,
                    settings.max_connections,
                    redact(url),
                    native=NativePool.beside(pool, settings),
                )
        return cls(raw, settings.max_connections, redact(url))

    # -- calls ----------------------------------------------------------------------------

    async def run_sync(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which uses the raw client) on a worker thread; map connection errors."""
        return await self._mapped(lambda: self._threads.run(fn))

    async def _mapped(self, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` with redis-py's errors mapped (``RedisUnavailable``,
        ``RedisRefused``) and the outage state kept."""
        try:
            try:
                result = await call()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                raise RedisUnavailable(f"redis at {self.description}: {exc}") from exc
            except _CLUSTER_UNAVAILABLE as exc:
                raise RedisUnavailable(f"redis cluster at {self.description}: {exc}") from exc
            except redis.exceptions.ResponseError as exc:
                if isinstance(exc, NoScriptError):
                    raise
                if isinstance(exc, redis.exceptions.ReadOnlyError):
                    self._replica_seen = True
                classified = classify(exc, self.description)
                if classified is exc:
                    raise
                raise classified from exc
            finally:
                if self._replica_seen:
                    await self._connect_anew()
        except RedisRefused:
            if self._down_since is not None:  # refused: so it answers
                self._mark_up()
            raise
        except RedisUnavailable as exc:
            self._mark_down(exc)
            raise
        if self._down_since is not None:
            self._mark_up()
        return result

    async def execute(self, *command: Any) -> Reply:
        """One command, e.g. ``await client.execute("XLEN", key)``."""
        return await self.run_sync(lambda: self._raw.execute_command(*command))

    async def execute_unparsed(self, *command: Any, slot_key: str = "") -> Reply:
        """One command, its reply as the server sent it (RESP3 maps and lists of bytes,
        redis-py's default protocol; RESP2 lists when the URL asks for ``protocol=2``),
        without redis-py's reply callback: for the fire path's stream reads, whose parsed
        form (a dict per entry) about doubled the client CPU a message (2.8 against 1.45 µs
        reading 200 entries). On a Cluster the command goes to the master of
        ``slot_key``'s slot (required there); a Cluster client without its own sockets
        (``native_io`` off, TLS) has no such path: there the reply is parsed as
        ``execute``'s (``reads_parsed``)."""
        if self.is_cluster:
            routes = self._routes
            if routes is None:
                return await self.execute(*command)
            if not slot_key:
                raise ValueError("execute_unparsed on a Cluster needs the slot_key it routes by")
            return await self._mapped(lambda: self._cluster_one(routes, slot_key, command))
        native = self._native
        if native is not None:
            return await self._mapped(lambda: native.one(command))

        def read(conn: Any) -> Reply:
            conn.send_command(*command)
            return conn.read_response()

        return await self.run_sync(lambda: self._on_connection(read))

    async def pipeline(
        self, commands: Sequence[Sequence[Any]], *, transaction: bool = False
    ) -> list[Reply]:
        """Several commands in one round trip (per shard in a cluster); replies in order.

        A command that fails yields its exception object in the reply list instead of
        aborting the batch, so a caller can tell which item of a bulk operation failed; a
        server lost mid-pipeline (a connection error in place on a Cluster) fails the call
        as ``RedisUnavailable``: nothing is known of its commands.
        """

        def run() -> list[Reply]:
            pipe = (
                self._raw.pipeline(transaction=transaction)
                if not self.is_cluster
                else (self._raw.pipeline())
            )
            for command in commands:
                pipe.execute_command(*command)
            return self._classified(list(pipe.execute(raise_on_error=False)))

        return await self.run_sync(run)

    async def reads(self, commands: Sequence[Sequence[Any]]) -> list[Reply]:
        """``pipeline`` for reads that need every reply: the first command Redis rejected
        (a key of another kind, a missing permission) is raised, never handed on as a value
        for a decoder to trip on."""
        replies = await self.pipeline(commands)
        rejected = next((r for r in replies if isinstance(r, Exception)), None)
        if rejected is not None:
            raise rejected
        return replies

    async def script(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Reply:
        """Run a Lua script by SHA, sending its source once if the server lacks it."""

        def run() -> Reply:
            try:
                return self._raw.evalsha(script.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                return self._raw.eval(script.source, len(keys), *keys, *args)

        return await self.run_sync(run)

    async def scripts(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Reply]:
        """Many calls of one script pipelined in one round trip; replies in order.

        Each call's keys must share a slot (as always); different calls may hit different
        shards of a cluster. A failed call yields its exception in place.
        """
        return await self.mixed_scripts([(script, keys, args) for keys, args in calls])

    async def mixed_scripts(
        self, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
    ) -> list[Reply]:
        """Calls of any scripts pipelined in one round trip; replies in order.

        In a cluster, calls to different shards may run in any order relative to each
        other: a caller that needs one write before another uses ``scripts_in_order``.
        """
        native, routes = self._native, self._routes
        if native is not None:
            return await self._mapped(lambda: self._native_script_calls(native, calls))
        if routes is not None:
            return await self._mapped(lambda: self._cluster_script_calls(routes, calls))
        return await self.run_sync(lambda: self._script_calls(calls))

    async def scripts_in_order(
        self,
        first: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        then: Callable[[list[Reply]], Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]],
    ) -> tuple[list[Reply], list[Reply]]:
        """``first`` pipelined, then the calls ``then`` picks from its replies (none: no
        second round trip; ``if_all_succeeded`` for "all of these, or none"): two round
        trips to Redis, so that nothing sent second runs unless the writes it depends on
        did (a pipeline runs every command, and cluster shards in no set order), and one
        hop to the I/O thread, which is most of a call's client CPU.

        ``then`` sees every reply of the first round, even when the call fails as an
        outage: a transient reply (``CLUSTERDOWN``, ``MASTERDOWN``...) or, on a Cluster
        over the node's own sockets, a master lost mid-call or answering ``LOADING`` is in
        place as ``RedisUnavailable`` (a connection error through redis-py's cluster
        pipeline too), and the other replies say which writes ran. The call then raises
        ``RedisUnavailable`` without a second round, so a caller that keeps what ``then``
        learned repeats only the rest. So too when a script the server lacks cannot be
        loaded: the calls that ran keep their replies, those left unknown or unsent hold
        the failure. A refused reply (``RedisRefused``: ``OOM``, ``NOPERM``, a refused
        ``SCRIPT LOAD`` or greeting) is no outage: it fails its own call, and the second
        round goes on."""

        native, routes = self._native, self._routes
        if native is not None:
            calls = functools.partial(self._native_script_calls, native)
            return await self._mapped(lambda: in_order(calls, first, then))
        if routes is not None:
            calls = functools.partial(self._cluster_script_calls, routes)
            return await self._mapped(lambda: in_order(calls, first, then))

        def run() -> tuple[list[Reply], list[Reply]]:
            replies = self._script_calls(first, True) if first else []
            second = then(replies)
            raise_outage(replies)
            return replies, self._script_calls(second) if second else []

        return await self.run_sync(run)

    async def wait_abandoned(self) -> bool:
        """Until every call abandoned on cancellation has ended (it reached Redis or
        failed): so that a step taken next cannot race a write given up on. Cancellable;
        each such call is bounded by the socket timeout. False when a call on the node's
        own sockets was still unanswered then (a paused server): it may yet run."""
        await self._threads.wait_abandoned()
        if self._native is not None:
            return await self._native.wait_abandoned()
        if self._routes is not None:
            return await self._cluster_wait_abandoned(self._routes)
        return True

    async def ping(self) -> bool:
        """Whether Redis answers; on a Cluster whose map a master's failure made stale, the
        map learned again and every master of it answering (``runtime.redis_cluster_native``)."""
        routes = self._routes
        if routes is not None and routes.stale:
            return await self._mapped(lambda: self._cluster_ping(routes))
        return bool(await self.run_sync(lambda: self._raw.ping()))

    async def time_ms(self) -> int:
        """Redis's own clock, the one that decides due-ness for every node."""
        seconds, micros = await self.run_sync(lambda: self._raw.time())
        return int(seconds) * 1000 + int(micros) // 1000

    async def clock_ms(self, max_age_s: float = 1.0) -> int:
        """Redis's clock without a round trip: the last ``TIME`` reading carried forward on
        the local monotonic clock, read again once older than ``max_age_s``. Off by at most
        a round trip; for placing things (a new task's first grid time, a signature's skew
        window), never for deciding due-ness, which the scripts do with ``TIME`` themselves."""
        now = time.monotonic()
        if self._clock is None or now - self._clock[0] > max_age_s:
            before = time.monotonic()
            redis_ms = await self.time_ms()
            # The reading is from somewhere within the round trip: take its middle.
            self._clock = ((before + time.monotonic()) / 2, redis_ms)
            return redis_ms
        at, redis_ms = self._clock
        return redis_ms + int((now - at) * 1000)

    @property
    def _raw(self) -> Any:
        if self._raw_client is None:
            assert self._connect is not None
            with self._connect_lock:
                if self._raw_client is None:
                    try:
                        self._raw_client = self._connect()
                    except redis.exceptions.RedisClusterException as exc:
                        # "cannot be connected": an outage like any other (run_sync maps it)
                        raise redis.exceptions.ConnectionError(str(exc)) from exc
        return self._raw_client

    @property
    def raw(self) -> Any:
        """The redis-py client, for code that runs inside ``run_sync`` only (a cluster
        client may connect on first use)."""
        return self._raw

    async def _connect_anew(self) -> None:
        """After a ``READONLY`` reply: the server this node is connected to was demoted (a
        failover behind one address: a managed endpoint's DNS name moved to the new
        primary). Its connections still work, as a replica's, so nothing else would ever
        replace them; every idle one is closed, and the next call connects to whatever
        the address names now (one in use is closed when its own call meets the reply).
        A Sentinel client asks the sentinels anew by itself; a Cluster is redirected."""
        self._replica_seen = False
        if self.is_cluster:
            return
        pool = self._raw.connection_pool
        if isinstance(pool, redis.BlockingConnectionPool):  # Sentinel's: not needed
            _disconnect_idle(pool)
        if self._native is not None:
            await self._native.close_idle()

    async def aclose(self) -> None:
        """Close the pool once in-flight calls (even abandoned ones, each bounded by its
        socket timeout) are done, so none opens a socket after the pool is closed."""
        with trio.CancelScope(shield=True):
            if self._native is not None:
                await self._native.aclose()
            if self._routes is not None:
                await self._cluster_close(self._routes)
            threads = self._threads.close()
            deadline = time.monotonic() + _CLOSE_WAIT_S

            def drain_and_close() -> None:
                for thread in threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
                if self._raw_client is not None:
                    self._raw_client.close()

            await trio.to_thread.run_sync(drain_and_close)


def _disconnect_idle(pool: redis.BlockingConnectionPool) -> None:
    """Close the connections of ``pool`` that no call holds: each taken out of the pool's
    queue first, so no thread takes one while it is closed (the pool's own ``disconnect``
    closes a list it read, which a thread may take from meanwhile), then put back, to
    connect anew at its next use. A thread asking the pool meanwhile waits (the queue
    blocks it) the few microseconds this takes."""
    taken: list[Any] = []
    with contextlib.suppress(queue.Empty):
        while True:
            taken.append(pool.pool.get_nowait())
    try:
        for conn in taken:
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a socket: nothing to report
                    conn.disconnect()
    finally:
        for conn in reversed(taken):  # a LIFO queue: its order as it was
            pool.pool.put_nowait(conn)
