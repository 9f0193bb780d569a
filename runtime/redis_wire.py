"""The direct-connection path of a ``RedisClient``: pipelined script calls written to and
read from one pooled connection without redis-py's per-command machinery (the path every
fire takes), with NOSCRIPT answered by loading the script and re-sending only the calls
that failed, and every error reply classified once (``runtime.redis_replies``). The same
calls on a ``runtime.redis_native`` pool, when the client has one, run on the trio thread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import hiredis
import redis
import redis.cluster
import redis.exceptions

from runtime.errors import RedisRefused, RedisUnavailable
from runtime.redis_native import SERVER_LOST, NativePool, pack
from runtime.redis_replies import ReplyClass, classify, reply_class, reply_text

T = TypeVar("T")

Reply = Any
"""A decoded Redis reply: bytes, int, list, None..."""

NoScriptError = redis.exceptions.NoScriptError

#: How often a pipelined script call is re-sent after NOSCRIPT (a server restarted or had
#: SCRIPT FLUSH between our load and our call); past that the error is returned in place.
_NOSCRIPT_RETRIES = 5


@attrs.frozen
class Script:
    """One Lua script, identified by its SHA1. Loaded lazily on first NOSCRIPT."""

    name: str
    source: str
    sha: str = attrs.field(init=False)

    @sha.default
    def _sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


#: What can fail a call midway, once some of its replies are in: an error reply (a refused
#: ``SCRIPT LOAD``), a lost connection, redis-py's cluster client giving up on its map.
#: Anything else (a bug, a protocol error) is raised as before.
FAILED_MIDWAY = (
    redis.exceptions.ResponseError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


def stand_in(exc: BaseException, description: str) -> Reply:
    """What a call left unknown or unsent by ``exc`` (one of ``FAILED_MIDWAY``) holds in
    place of its reply: an error reply as itself (``_classified`` classifies it), anything
    else an outage."""
    if isinstance(exc, redis.exceptions.ResponseError) and not isinstance(exc, NoScriptError):
        return exc
    return RedisUnavailable(f"redis at {description}: {exc}")


def unknown_in_place(replies: list[Reply], exc: BaseException, description: str) -> list[Reply]:
    """``replies`` with each call still missing its script (not run, or sent again and
    its reply lost when ``exc`` ended the loading) given ``stand_in(exc)``."""
    return [stand_in(exc, description) if isinstance(r, NoScriptError) else r for r in replies]


def is_outage(reply: Reply) -> bool:
    """Whether a reply in place says the call met an outage (``RedisUnavailable`` put there
    by ``_classified``), not a refusal (``RedisRefused``, its subclass: the server answered)."""
    return isinstance(reply, RedisUnavailable) and not isinstance(reply, RedisRefused)


class DirectCalls:
    """The script-call half of ``RedisClient`` (its ``_raw`` client, ``is_cluster`` and
    ``description`` are the client's)."""

    description: str
    is_cluster: bool
    _native: NativePool | None
    _replica_seen: bool

    @property
    def _raw(self) -> Any:
        raise NotImplementedError

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

    def _script_calls(
        self,
        calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        outages_in_place: bool = False,
    ) -> list[Reply]:
        """``mixed_scripts``' work, in the I/O thread."""
        return self._classified(self._evalsha_loading(calls, outages_in_place), outages_in_place)

    def _evalsha_loading(
        self,
        calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        outages_in_place: bool = False,
    ) -> list[Reply]:
        """The calls by SHA, each script the server lacks loaded and only its calls sent
        again; the replies unclassified. In the I/O thread. ``outages_in_place``: a
        failure while loading leaves the calls still missing their script ``stand_in``
        for it, and the other replies kept."""
        if not calls:
            return []
        replies = self._pipelined_evalsha(calls)
        try:
            for _ in range(_NOSCRIPT_RETRIES):
                missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
                if not missing:
                    break
                # Only the calls that failed are sent again: the others already ran (a
                # script can appear mid-pipeline, loaded by a concurrent caller), and
                # running them twice would, for example, enqueue a fire twice.
                for script in {calls[i][0] for i in missing}:
                    self._load_everywhere(script)
                retried = self._pipelined_evalsha([calls[i] for i in missing])
                for i, reply in zip(missing, retried, strict=True):
                    replies[i] = reply
        except FAILED_MIDWAY as exc:
            if not outages_in_place:
                raise
            return unknown_in_place(replies, exc, self.description)
        return replies

    async def _native_script_calls(
        self,
        native: NativePool,
        calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        outages_in_place: bool = False,
    ) -> list[Reply]:
        """``_script_calls`` on the trio thread, over ``native``."""
        replies = await native_evalsha(native, calls, outages_in_place, self.description)
        return self._classified(replies, outages_in_place)

    def _classified(self, replies: list[Reply], outages_in_place: bool = False) -> list[Reply]:
        """A pipeline's replies with each error reply classified: a transient one raises
        for the whole call (as ``ConnectionError``, which ``run_sync`` reports as
        ``RedisUnavailable``), so the caller waits for the server instead of taking it for a
        failed command; a refused one is returned in place as ``RedisRefused``.

        A connection error in place (a node redis-py's cluster pipeline could not reach)
        is an outage too: raised, never handed on as a reply.

        ``outages_in_place``: a transient reply or a connection error is returned in place
        instead, as ``RedisUnavailable``, for a caller that must learn which of the other
        calls ran before it raises (``RedisClient.scripts_in_order``)."""
        out = list(replies)
        for i, reply in enumerate(out):
            if not isinstance(reply, Exception):  # the usual case: one check
                continue
            if isinstance(reply, SERVER_LOST):  # redis-py's cluster pipeline leaves these
                if not outages_in_place:
                    raise reply
                out[i] = stand_in(reply, self.description)
                continue
            if not isinstance(reply, redis.exceptions.ResponseError) or isinstance(
                reply, NoScriptError
            ):
                continue
            if isinstance(reply, redis.exceptions.ReadOnlyError):
                self._replica_seen = True  # the client connects anew (RedisClient._mapped)
            if not outages_in_place and reply_class(reply) is ReplyClass.TRANSIENT:
                raise redis.exceptions.ConnectionError(reply_text(reply))
            # In place: transient (RedisUnavailable), refused, or rejected (the reply itself).
            out[i] = classify(reply, self.description)
        return out

    def _pipelined_evalsha(
        self, calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]
    ) -> list[Reply]:
        commands = evalsha_commands(calls)
        if not self.is_cluster:
            return self._on_connection(lambda conn: _send_and_read(conn, commands))
        pipe = self._raw.pipeline()
        for command in commands:
            # execute_command, not pipe.evalsha: redis-py's cluster pipeline refuses the
            # evalsha method by name, but routes a raw EVALSHA by its keys' slot.
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    def _load_everywhere(self, script: Script) -> None:
        if self.is_cluster:
            self._raw.execute_command(
                "SCRIPT", "LOAD", script.source, target_nodes=redis.cluster.RedisCluster.PRIMARIES
            )
        else:
            self._raw.script_load(script.source)


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


async def native_evalsha(
    native: NativePool,
    calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
    outages_in_place: bool = False,
    description: str = "",
) -> list[Reply]:
    """The calls by SHA over ``native``, on the trio thread, each script the server lacks
    loaded there and only its calls sent again; the replies unclassified (with
    ``outages_in_place``, as ``DirectCalls._evalsha_loading``)."""
    if not calls:
        return []
    commands = evalsha_commands(calls)
    replies = await native.pipelined(pack(commands), len(commands))
    try:
        return await load_missing(native, calls, commands, replies)
    except FAILED_MIDWAY as exc:
        if not outages_in_place:
            raise
        return unknown_in_place(replies, exc, description or native.address)


def evalsha_commands(
    calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
) -> list[tuple[Any, ...]]:
    return [("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls]


async def load_missing(
    native: NativePool,
    calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
    commands: Sequence[Sequence[Any]],
    replies: list[Reply],
) -> list[Reply]:
    """``replies`` of ``commands`` sent to ``native``'s server, where a script was missing
    (NOSCRIPT) loaded there and only those calls sent again."""
    for _ in range(_NOSCRIPT_RETRIES):
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if not missing:
            break
        sources = list({calls[i][0].source for i in missing})
        loads = [("SCRIPT", "LOAD", source) for source in sources]
        for loaded in await native.pipelined(pack(loads), len(loads)):
            if isinstance(loaded, redis.exceptions.ResponseError):
                raise loaded
        retried = await native.pipelined(pack([commands[i] for i in missing]), len(missing))
        for i, reply in zip(missing, retried, strict=True):
            replies[i] = reply
    return replies


# -- calls in two rounds (``RedisClient.scripts_in_order``) ------------------------------


class _ScriptCalls(Protocol):
    """A client path's pipelined script calls (``DirectCalls._native_script_calls``,
    ``ClusterCalls._cluster_script_calls``, bound to their pool or routes)."""

    def __call__(
        self,
        calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
        outages_in_place: bool = False,
    ) -> Awaitable[list[Reply]]: ...


async def in_order(
    calls: _ScriptCalls,
    first: Sequence[Any],
    then: Callable[[list[Reply]], Sequence[Any]],
) -> tuple[list[Reply], list[Reply]]:
    """``RedisClient.scripts_in_order`` on the trio thread: ``calls(first)`` with outages in place,
    then the calls ``then`` picks from its replies."""
    replies = await calls(first, True) if first else []
    second = then(replies)
    raise_outage(replies)
    return replies, await calls(second) if second else []


def raise_outage(replies: list[Reply]) -> None:
    """The first round's outage, raised once ``then`` has seen every reply (``RedisClient._mapped``
    marks the client down)."""
    for reply in replies:
        if is_outage(reply):
            raise RedisUnavailable(str(reply)) from reply


def if_all_succeeded(
    calls: Sequence[tuple[Script, Sequence[Any], Sequence[Any]]],
) -> Callable[[list[Reply]], Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]]:
    """For ``RedisClient.scripts_in_order``: ``calls`` once every reply of the first round is a
    success, else nothing."""

    def pick(replies: list[Reply]) -> Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]:
        return [] if any(isinstance(r, Exception) for r in replies) else calls

    return pick
