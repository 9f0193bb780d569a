"""Riding out a Redis that is unreachable, stalled or refusing: the outage and refusal
state of a ``RedisClient`` and the waits through them (``ride_out``), so an actor's step
is repeated once Redis answers (or, after a refusal, once a backoff has passed) instead of
the actor crashing. Logs ``redis_unreachable`` / ``redis_reachable`` once per outage and
``redis_refused`` / ``redis_accepting`` once per run of refusals.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.exceptions
import trio

from runtime.errors import RedisRefused, RedisUnavailable
from runtime.logging import notify_observers
from runtime.redis_replies import refused, restarts

T = TypeVar("T")

ResponseError = redis.exceptions.ResponseError

#: Probing an unreachable Redis: the first wait, doubling (with jitter) up to the cap, so
#: fires resume within about a second of Redis answering again.
_PROBE_FIRST_S = 0.05
_PROBE_CAP_S = 1.0
#: Repeating a step Redis refused: the first wait, doubling (with jitter) up to the cap.
_REFUSED_FIRST_S = 0.1
_REFUSED_CAP_S = 2.0


class OutageRiding:
    """The outage and refusal half of ``RedisClient``: its state is set by the client's
    constructor; ``ping`` is the client's."""

    description: str
    _log: Any
    _down_since: float | None
    _refused: RedisRefused | None
    _refused_steps: int
    _refused_since: float
    disruptions: collections.deque[tuple[float, float]]

    async def ping(self) -> bool:
        raise NotImplementedError

    def _mark_down(self, error: RedisUnavailable) -> None:
        """A call failed to reach Redis: the first such failure logs the outage."""
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._log.warning("redis_unreachable", redis=self.description, error=str(error))

    def _mark_up(self) -> None:
        if self._down_since is not None:
            outage_s = round(time.monotonic() - self._down_since, 3)
            self._down_since = None
            self._recovered(outage_s)
            self._log.info("redis_reachable", redis=self.description, outage_s=outage_s)

    def _recovered(self, length_s: float) -> None:
        """An outage or a run of refusals ``length_s`` long ended now."""
        ended = time.monotonic()
        # a shorter or equal one before it no longer matters: blips replace each other, and
        # a long one stays until a longer one, or 64 ever shorter ones, come after it
        while self.disruptions and self.disruptions[-1][1] <= length_s:
            self.disruptions.pop()
        self.disruptions.append((ended, length_s))

    def last_ended(self, at_least_s: float) -> float | None:
        """When the latest outage or run of refusals of ``at_least_s`` or longer ended
        (monotonic; None: none among the latest ones): a shorter one after it leaves it
        the one a claimer waits a lease after."""
        return max((end for end, length in self.disruptions if length >= at_least_s), default=None)

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
            self._recovered(time.monotonic() - self._refused_since)
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
        attempt = 0
        while True:
            try:
                await self.ping()
                return
            except RedisRefused:  # an answer: the step will meet the refusal and wait it out
                return
            except RedisUnavailable:
                pass
            await trio.sleep(_probe_wait(attempt))
            attempt += 1

    async def wait_unavailable(self, failures: int) -> None:
        """The wait after the ``failures``-th failure in a row of a step as unavailable:
        until Redis answers the probe; from the second on, first the probe's backoff,
        since Redis answered the probe, yet the step failed again (a server up but not
        for this step: a Cluster's slot without a master, ``CLUSTERDOWN``, ``TRYAGAIN``),
        so that no step is repeated in a loop."""
        if failures > 1:
            await trio.sleep(_probe_wait(failures - 2))
        await self.wait_until_reachable()

    async def ride_out(
        self, step: Callable[[], Awaitable[T]], actor: str = "", refused_cap_s: float | None = None
    ) -> T:
        """Run ``step``; while Redis is unreachable or stalled, wait for it and run ``step``
        again; while Redis refuses it (writes refused, a permission missing, a command
        rejected: ``runtime.redis_replies``), run it again after a capped, jittered
        backoff. For steps that are safe to repeat (a poller tick, a consumer read, a
        batch's completion): an outage or a refusal is a state the actor waits through,
        not a crash. ``actor``: who is waiting, for the
        ``redis_refused`` line; ``refused_cap_s``: the longest wait between two tries while
        refused, if shorter than the usual cap (a step that must recur within a lease)."""
        refusals = unavailable = 0
        try:
            while True:
                try:
                    result = await step()
                except RedisRefused as exc:
                    refusals += 1
                    await self.wait_refused(exc, refusals, actor, refused_cap_s)
                    continue
                except ResponseError as exc:  # rejected: the command cannot succeed as sent
                    if restarts(exc):
                        raise
                    refusals += 1
                    error = refused(exc, self.description)
                    await self.wait_refused(error, refusals, actor, refused_cap_s)
                    continue
                except RedisUnavailable:
                    unavailable += 1
                    await self.wait_unavailable(unavailable)
                    continue
                if refusals:
                    self.refusal_ended(accepted=True)
                    refusals = 0
                return result
        finally:
            if refusals:
                self.refusal_ended(accepted=False)

    async def wait_refused(
        self, error: RedisRefused, refusals: int, actor: str = "", cap_s: float | None = None
    ) -> None:
        """The wait after the ``refusals``-th refusal in a row of a step (``ride_out``'s, or
        a caller's that repeats the step itself, as a consumer's read does: it ends the
        run with ``refusal_ended``)."""
        self._note_refused(error, actor, first=refusals == 1)
        cap = _REFUSED_CAP_S if cap_s is None else min(cap_s, _REFUSED_CAP_S)
        delay = min(cap, _REFUSED_FIRST_S * 2 ** min(refusals - 1, 10))
        await trio.sleep(delay * random.uniform(0.5, 1.0))


def _probe_wait(attempt: int) -> float:
    """The ``attempt``-th wait (from 0) of a probe's backoff, with its jitter."""
    delay: float = min(_PROBE_CAP_S, _PROBE_FIRST_S * 2 ** min(attempt, 10))
    return delay * random.uniform(0.5, 1.0)
