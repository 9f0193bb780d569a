"""Whether a Redis server the node just started is ready, and waiting until it is.

A starting server is in one of three states as a PING sees it: ready; alive but loading
its data (``-LOADING``: an AOF or RDB of any size, which takes as long as it takes); or
silent (not listening yet, or hung). Only silence is bounded: a start is given up after
``SILENCE_LIMIT_S`` without any answer, while loading is waited for and reported. Apart
from the embedded server's actor (``runtime.embedded_redis``) so that the rule can be
tested against a real server on its own.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

from runtime.errors import RuntimeStartError

#: How long a starting server may give no answer at all (not listening yet, or hung) before
#: its start is given up. One that answers LOADING is alive and is waited for.
SILENCE_LIMIT_S = 15.0
#: How often a ``redis_loading`` line is written while the server loads its data.
LOADING_REPORT_S = 5.0
_READY_POLL_S = 0.02
_LOADING_POLL_S = 0.2


class Answer(enum.Enum):
    """What a starting server answered a PING."""

    READY = "ready"
    LOADING = "loading"
    """Alive, loading its data (``-LOADING``): it answers, it only cannot serve yet."""
    NONE = "none"
    """No answer: not listening yet, or hung."""


async def wait_ready(
    ping: Callable[[], Answer],
    still_running: Callable[[], None],
    report_loading: Callable[[float], Awaitable[None]],
    *,
    silence_limit_s: float = SILENCE_LIMIT_S,
    report_every_s: float = LOADING_REPORT_S,
) -> None:
    """Until the server answers PING. A server loading a large AOF or RDB answers LOADING
    for as long as it takes, so only silence is bounded: a start is given up when the
    server gives no answer at all for ``silence_limit_s`` (or ``still_running`` raises,
    the process having exited). While it loads, ``report_loading(elapsed_s)`` is awaited
    at once and every ``report_every_s``, so a long start is visibly alive, not a hang.
    ``ping`` may block on the server: it runs on a worker thread."""
    start = last_answer = next_report = trio.current_time()
    while True:
        still_running()
        answer = await trio.to_thread.run_sync(ping)
        now = trio.current_time()
        if answer is Answer.READY:
            return
        if answer is Answer.LOADING:
            last_answer = now
            if now >= next_report:
                await report_loading(now - start)
                next_report = now + report_every_s
        elif now - last_answer > silence_limit_s:
            still_running()  # an exit explains the silence best
            raise RuntimeStartError(
                f"embedded redis-server gave no answer for {silence_limit_s:g} s"
            )
        await trio.sleep(_LOADING_POLL_S if answer is Answer.LOADING else _READY_POLL_S)


def probe_client(socket_path: Path, password: str | None, timeout_s: float = 1.0) -> redis.Redis:
    """A client for ``probe``: one call is one attempt (redis-py's own retries would wait
    out a LOADING reply, or silence, inside a single probe)."""
    return redis.Redis(
        unix_socket_path=str(socket_path),
        password=password,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def probe(client: redis.Redis) -> Answer:
    """One PING of a starting server. A password it refuses is a start error, not silence:
    waiting would not change it."""
    try:
        client.ping()
    except redis.exceptions.BusyLoadingError:
        return Answer.LOADING
    except redis.exceptions.AuthenticationError as exc:
        message = f"embedded redis-server refused the node's password: {exc}"
        raise RuntimeStartError(message) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        return Answer.NONE
    return Answer.READY


def loaded_perc(client: redis.Redis) -> float | None:
    """How much of its data a loading server has read (INFO persistence, which it answers
    while loading); None if it does not say."""
    try:
        info = client.info("persistence")
    except (redis.exceptions.RedisError, OSError):
        return None
    value = info.get("loading_loaded_perc")
    return float(value) if isinstance(value, int | float) else None
