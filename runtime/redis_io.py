"""All Redis I/O: redis-py, driven from trio through a bounded pool of worker threads.

Why threads: redis-py (the client the design names) has no trio support, and its asyncio
client cannot run on trio. So every call leaves the trio thread via ``trio.to_thread``:

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
"""

from __future__ import annotations

import hashlib
import random
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import hiredis
import redis
import redis.cluster
import redis.exceptions
import redis.sentinel
import trio

from runtime.config import SENTINEL_SCHEMES, RedisSection, parse_sentinel_url
from runtime.errors import RedisRefused, RedisUnavailable
from runtime.io_threads import IOThreads
from runtime.logging import get_logger, notify_observers
from runtime.redis_replies import (
    ReplyClass,
    classify,
    refused,
    reply_class,
    reply_text,
    restarts,
)

T = TypeVar("T")

Reply = Any
"""A decoded Redis reply: bytes, int, list, None..."""

ResponseError = redis.exceptions.ResponseError
NoScriptError = redis.exceptions.NoScriptError

#: How often a pipelined script call is re-sent after NOSCRIPT (a server restarted or had
#: SCRIPT FLUSH between our load and our call); past that the error is returned in place.
_NOSCRIPT_RETRIES = 5
#: Longest wait in ``aclose`` for calls still running on the I/O threads.
_CLOSE_WAIT_S = 6.0
#: Probing an unreachable Redis: the first wait, doubling (with jitter) up to the cap, so
#: fires resume within about a second of Redis answering again.
_PROBE_FIRST_S = 0.05
_PROBE_CAP_S = 1.0
#: Repeating a step Redis refused: the first wait, doubling (with jitter) up to the cap.
_REFUSED_FIRST_S = 0.1
_REFUSED_CAP_S = 2.0


@attrs.frozen
class Script:
    """One Lua script, identified by its SHA1. Loaded lazily on first NOSCRIPT."""

    name: str
    source: str
    sha: str = attrs.field(init=False)

    @sha.default
    def _sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


class RedisClient:
    """The async face of one redis-py client (standalone or cluster)."""

    def __init__(
        self,
        raw: Any,
        max_connections: int,
        description: str,
        *,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        """``raw``: the redis-py client; or None and ``connect``, which builds it at the
        first call (a cluster client connects as it is built: this way a node starting
        while its cluster is unreachable waits for it like for any outage)."""
        self._raw_client = raw
        self._connect = connect
        self._connect_lock = threading.Lock()
        self._threads = IOThreads(max_connections)
        self.description = description
        self.is_cluster = connect is not None or isinstance(raw, redis.cluster.RedisCluster)
        self._clock: tuple[float, int] | None = None  # (local monotonic s, Redis ms) at reading
        self._down_since: float | None = None
        """Monotonic time of the first failed call of the current outage; None: reachable."""
        self._refused: RedisRefused | None = None
        """The refusal that began the current run of refused steps; None: none."""
        self._refused_steps = 0
        """Steps waiting to be repeated after a refusal right now (``ride_out``)."""
        self._refused_since = 0.0
        """Monotonic time the current run of refusals began."""
        self.disruption_s = 0.0
        """How long the last outage or run of refusals lasted (with ``recovered_at``)."""
        self.recovered_at: float | None = None
        """Monotonic time the last outage or run of refusals ended (None: none seen): a
        claimer waits a lease after it before taking over other consumers' messages,
        whose renewals could not get through meanwhile."""
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
            common.update(_tls_options(settings))
        if url.startswith(SENTINEL_SCHEMES):
            raw: Any = _sentinel_master(url, settings, common)
        elif settings.cluster:
            return cls(
                None,
                settings.max_connections,
                _redact(url),
                connect=lambda: redis.cluster.RedisCluster.from_url(
                    url, max_connections=settings.max_connections, **common
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
        return cls(raw, settings.max_connections, _redact(url))

    # -- calls ----------------------------------------------------------------------------

    async def run_sync(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which uses the raw client) on a worker thread; map connection errors."""

        def guarded() -> T:
            try:
                return fn()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                raise RedisUnavailable(f"redis at {self.description}: {exc}") from exc
            except redis.exceptions.ClusterDownError as exc:
                raise RedisUnavailable(f"redis cluster at {self.description}: {exc}") from exc
            except redis.exceptions.ResponseError as exc:
                if isinstance(exc, NoScriptError):
                    raise
                classified = classify(exc, self.description)
                if classified is exc:
                    raise
                raise classified from exc

        try:
            result = await self._threads.run(guarded)
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

    async def execute_unparsed(self, *command: Any) -> Reply:
        """One command, its reply as the server sent it (RESP3 maps and lists of bytes,
        redis-py's default protocol; RESP2 lists when the URL asks for ``protocol=2``),
        without redis-py's reply callback: for the fire path's stream reads, whose parsed
        form (a dict per entry) about doubled the client CPU a message (2.8 against 1.45 µs
        reading 200 entries). A cluster client has no such path: there the reply is parsed
        as ``execute``'s."""
        if self.is_cluster:
            return await self.execute(*command)

        def read(conn: Any) -> Reply:
            conn.send_command(*command)
            return conn.read_response()

        return await self.run_sync(lambda: self._on_connection(read))

    def _on_connection(self, work: Callable[[Any], T]) -> T:
        """``work(connection)`` on a connection of the (standalone or Sentinel) client's
        pool, under the connection's retry policy as redis-py runs a command: a failed
        attempt drops the connection (its replies may be half read). In the I/O thread.

        Why not ``execute_command``/``pipeline``: per call they add reply callbacks and
        observability hooks (redis-py 8 records each command's duration): ~30-70 µs of
        client CPU more for a pipeline of ten script calls, on the paths every fire takes."""
        pool = self._raw.connection_pool
        conn = pool.get_connection()
        try:
            return conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: work(conn), lambda _error: conn.disconnect()
            )
        finally:
            pool.release(conn)

    async def pipeline(
        self, commands: Sequence[Sequence[Any]], *, transaction: bool = False
    ) -> list[Reply]:
        """Several commands in one round trip (per shard in a cluster); replies in order.

        A command that fails yields its exception object in the reply list instead of
        aborting the batch, so a caller can tell which item of a bulk operation failed.
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
        return await self.run_sync(lambda: self._script_calls(calls))

    async def scripts_in_order(
        self,
        first: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        then: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
    ) -> tuple[list[Reply], list[Reply] | None]:
        """``first`` pipelined, then ``then`` only once every reply of ``first`` is a
        success (else None for it): two round trips to Redis, so that nothing in ``then``
        runs unless ``first`` did (a pipeline runs every command, and cluster shards in no
        set order), and one hop to the I/O thread, which is most of a call's client CPU."""

        def run() -> tuple[list[Reply], list[Reply] | None]:
            replies = self._script_calls(first)
            if any(isinstance(r, Exception) for r in replies):
                return replies, None
            return replies, self._script_calls(then)

        return await self.run_sync(run)

    def _script_calls(
        self, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
    ) -> list[Reply]:
        """``mixed_scripts``' work, in the I/O thread."""
        if not calls:
            return []
        replies = self._pipelined_evalsha(calls)
        for _ in range(_NOSCRIPT_RETRIES):
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if not missing:
                break
            # Only the calls that failed are sent again: the others already ran (a script
            # can appear mid-pipeline, loaded by a concurrent caller), and running them
            # twice would, for example, enqueue a fire twice.
            for script in {calls[i][0] for i in missing}:
                self._load_everywhere(script)
            retried = self._pipelined_evalsha([calls[i] for i in missing])
            for i, reply in zip(missing, retried, strict=True):
                replies[i] = reply
        return self._classified(replies)

    def _classified(self, replies: list[Reply]) -> list[Reply]:
        """A pipeline's replies with each error reply classified: a transient one raises
        for the whole call (as ``ConnectionError``, which ``run_sync`` reports as
        ``RedisUnavailable``), so the caller waits for the server instead of taking it for a
        failed command; a refused one is returned in place as ``RedisRefused``."""
        out = list(replies)
        for i, reply in enumerate(out):
            if not isinstance(reply, redis.exceptions.ResponseError) or isinstance(
                reply, NoScriptError
            ):
                continue
            if reply_class(reply) is ReplyClass.TRANSIENT:
                raise redis.exceptions.ConnectionError(reply_text(reply))
            out[i] = classify(reply, self.description)  # rejected: the reply itself
        return out

    def _pipelined_evalsha(
        self, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
    ) -> list[Reply]:
        if not self.is_cluster:
            commands = [
                ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls
            ]
            return self._on_connection(lambda conn: _send_and_read(conn, commands))
        pipe = self._raw.pipeline()
        for script, keys, args in calls:
            # execute_command, not pipe.evalsha: redis-py's cluster pipeline refuses the
            # evalsha method by name, but routes a raw EVALSHA by its keys' slot.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return list(pipe.execute(raise_on_error=False))

    def _load_everywhere(self, script: Script) -> None:
        if self.is_cluster:
            self._raw.execute_command(
                "SCRIPT", "LOAD", script.source, target_nodes=redis.cluster.RedisCluster.PRIMARIES
            )
        else:
            self._raw.script_load(script.source)

    async def wait_abandoned(self) -> None:
        """Until every call abandoned on cancellation has ended (it reached Redis or
        failed): so that a step taken next cannot race a write given up on. Cancellable;
        each such call is bounded by the socket timeout."""
        await self._threads.wait_abandoned()

    async def ping(self) -> bool:
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

    # -- reachability -----------------------------------------------------------------------

    def _mark_down(self, error: RedisUnavailable) -> None:
        """A call failed to reach Redis: the first such failure logs the outage."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._log.warning("redis_unreachable", redis=self.description, error=str(error))

    def _mark_up(self) -> None:
        if self._down_since is not None:
            outage_s = round(time.monotonic() - self._down_since, 3)
            self._down_since = None
            self.recovered_at, self.disruption_s = time.monotonic(), outage_s
            self._log.info("redis_reachable", redis=self.description, outage_s=outage_s)

    def _note_refused(self, error: RedisRefused, actor: str, first: bool) -> None:
        """A step was refused; ``first``: its first refusal (it starts waiting). The first
        refusal of a run is logged (with the fix) and counted through the log line; each
        later one is counted (``redis_refused`` observers' event)."""
        if first:
            self._refused_steps += 1
        if self._refused is None:
            self._refused, self._refused_since = error, time.monotonic()
            line = {"actor": actor} if actor else {}
            self._log.error(
                "redis_refused", redis=self.description, kind=error.kind, error=str(error),
                fix=error.fix, **line,
            )  # fmt: skip
        else:
            notify_observers(actor, [("redis_refused", {"kind": error.kind})])

    def refusal_ended(self, *, accepted: bool) -> None:
        """A step that was refused ended: went through (``accepted``), or was given up
        (cancelled, or failed otherwise). The run of refusals ends with its last step."""
        self._refused_steps -= 1
        if self._refused_steps or self._refused is None:
            return
        kind, self._refused = self._refused.kind, None
        if accepted:
            self.recovered_at = time.monotonic()
            self.disruption_s = self.recovered_at - self._refused_since
            self._log.info("redis_accepting", redis=self.description, after=kind)

    @property
    def reachable(self) -> bool:
        """False from a call that could not reach Redis until one that could."""
        return self._down_since is None

    @property
    def refusing(self) -> str | None:
        """While steps wait to be repeated after a refusal: the first refusal's kind
        (``refused_write``, ``permission``, ``rejected``); None when none waits."""
        return None if self._refused is None else self._refused.kind

    async def wait_until_reachable(self) -> None:
        """Until Redis answers PING, probing with capped, jittered backoff (cancellable).

        Many actors may wait at once; each probes on its own, which costs a few PINGs a
        second at most."""
        delay = _PROBE_FIRST_S
        while True:
            try:
                await self.ping()
                return
            except RedisUnavailable:
                pass
            await trio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, _PROBE_CAP_S)

    async def ride_out(self, step: Callable[[], Awaitable[T]], actor: str = "") -> T:
        """Run ``step``; while Redis is unreachable or stalled, wait for it and run ``step``
        again; while Redis refuses it (writes refused, a permission missing, a command
        rejected: ``runtime.redis_replies``), run it again after a capped, jittered
        backoff. For steps that are safe to repeat (a poller tick, a consumer read, a
        batch's completion): an outage or a refusal is a state the actor waits through,
        not a crash. ``actor``: who is waiting, for the ``redis_refused`` line."""
        refusals = 0
        try:
            while True:
                try:
                    result = await step()
                except RedisRefused as exc:
                    refusals += 1
                    await self.wait_refused(exc, refusals, actor)
                    continue
                except ResponseError as exc:  # rejected: the command cannot succeed as sent
                    if restarts(exc):
                        raise
                    refusals += 1
                    await self.wait_refused(refused(exc, self.description), refusals, actor)
                    continue
                except RedisUnavailable:
                    await self.wait_until_reachable()
                    continue
                if refusals:
                    self.refusal_ended(accepted=True)
                    refusals = 0
                return result
        finally:
            if refusals:
                self.refusal_ended(accepted=False)

    async def wait_refused(self, error: RedisRefused, refusals: int, actor: str = "") -> None:
        """The wait after the ``refusals``-th refusal in a row of a step (``ride_out``'s, or
        a caller's that repeats the step itself, as a consumer's read does: it ends the
        run with ``refusal_ended``)."""
        self._note_refused(error, actor, first=refusals == 1)
        delay = min(_REFUSED_CAP_S, _REFUSED_FIRST_S * 2 ** min(refusals - 1, 10))
        await trio.sleep(delay * random.uniform(0.5, 1.0))

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

    async def aclose(self) -> None:
        """Close the pool once in-flight calls (even abandoned ones, each bounded by its
        socket timeout) are done, so none opens a socket after the pool is closed."""
        with trio.CancelScope(shield=True):
            threads = self._threads.close()
            deadline = time.monotonic() + _CLOSE_WAIT_S

            def drain_and_close() -> None:
                for thread in threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
                if self._raw_client is not None:
                    self._raw_client.close()

            await trio.to_thread.run_sync(drain_and_close)


def _sentinel_master(url: str, settings: RedisSection, common: dict[str, Any]) -> Any:
    """A client of the primary that Sentinel names for the service, found again after a
    failover: a connection to a demoted primary fails (READONLY becomes a connection error
    in redis-py), so ``ride_out`` waits, and the next connection asks the sentinels anew.

    ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`` (port 26379
    when left out; ``rediss+sentinel://`` for TLS to the primary)."""
    sentinels, service, db, username, password = parse_sentinel_url(url)
    timeouts = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
    }
    options = dict(common)
    if username is not None:
        options["username"] = username
    if password is not None:
        options["password"] = password
    manager = redis.sentinel.Sentinel(sentinels, sentinel_kwargs=timeouts)  # type: ignore[no-untyped-call]
    return manager.master_for(  # type: ignore[no-untyped-call]
        service, db=db, max_connections=settings.max_connections, **options
    )


def _send_and_read(conn: Any, commands: Sequence[Sequence[Any]]) -> list[Reply]:
    """Commands pipelined on one connection, their replies in order; an error reply is
    returned in place (as ``pipeline(raise_on_error=False)`` does)."""
    try:
        # hiredis packs a whole command in C; redis-py's packer first walks every
        # argument in Python (48 against 23 µs for a 255-argument script call)
        packed = [b"".join([hiredis.pack_command(tuple(command)) for command in commands])]
    except TypeError:  # an argument hiredis does not take (a bytearray): redis-py's way,
        packed = conn.pack_commands(commands)  # which converts it or raises DataError
    conn.send_packed_command(packed)
    replies: list[Reply] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


def _tls_options(settings: RedisSection) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if settings.tls_ca_file:
        options["ssl_ca_certs"] = settings.tls_ca_file
    if settings.tls_cert_file:
        options["ssl_certfile"] = settings.tls_cert_file
    if settings.tls_key_file:
        options["ssl_keyfile"] = settings.tls_key_file
    return options


def _redact(url: str) -> str:
    """The URL without its password, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***@' if user else '***@'}{host}"
