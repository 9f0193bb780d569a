"""A type's stream that Redis rejects holds back that type's fires only.

Redis rejects a call as it was sent (``rejected_alone``: a stream key holding another kind
of value, ``WRONGTYPE``) for as long as the key stays so. Waited on like an outage, one
broken stream would hold up every type the poller and the retry dispatcher serve. So both
append the fires of a tick type by type once a call is rejected, and go on with every
type whose stream takes them (``append_by_type``); what they do with the fires held back
is theirs (the retry dispatcher leaves them claimed, the poller moves their tasks a claim
lease on with their grid where it was). Likewise a partition whose keys Redis rejects: the
retry dispatcher leaves it out of its claims, and the poller sets it aside (``SetAside``)
and goes on with the others. ``Notices`` says each rejection once, and when it is over.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import structlog
import trio

from actors.store.replies import Commit, Fire, FireCommit
from actors.store.scripts import Scripts
from runtime.logging import emit_events, get_logger
from runtime.redis_io import RedisClient, ResponseError
from runtime.redis_replies import PartRejected, rejected_alone, reply_text

T = TypeVar("T")


class Rejected(Exception):
    """A call Redis rejected (``rejected_alone``), which ``ride_out`` does not wait on."""

    def __init__(self, error: ResponseError) -> None:
        super().__init__(str(error))
        self.error = error


async def unless_rejected(step: Callable[[], Awaitable[T]]) -> T:
    """``step()``, a rejection of it raised as ``Rejected``."""
    try:
        return await step()
    except ResponseError as exc:
        if not rejected_alone(exc):
            raise
        raise Rejected(exc) from exc


async def apart_by_type(
    redis: RedisClient, whole: Callable[[], Awaitable[Any]],
    part: Callable[[str], Awaitable[Any]], types: Sequence[str], at_once: bool,
) -> dict[str, ResponseError]:  # fmt: skip
    """A step over several types, riding out outages and refusals: ``whole()`` first when
    ``at_once`` or of one type alone, then, if that was rejected or not ``at_once``,
    ``part(t)`` for each type, each once (the caller's step must be safe to repeat). The
    types Redis rejects (a key of another kind), with its error."""
    if at_once or len(types) == 1:
        try:
            await redis.ride_out(functools.partial(unless_rejected, whole))
            return {}
        except Rejected as exc:
            if len(types) == 1:
                return {types[0]: exc.error}
    rejected: dict[str, ResponseError] = {}
    for task_type in types:
        try:
            await redis.ride_out(
                functools.partial(unless_rejected, functools.partial(part, task_type))
            )
        except Rejected as exc:
            rejected[task_type] = exc.error
    return rejected


async def append_by_type(
    redis: RedisClient,
    append: Callable[[list[Fire]], Awaitable[Any]],
    fires: list[Fire],
    at_once: bool,
) -> dict[str, ResponseError]:
    """Append ``fires`` with ``append`` (``apart_by_type``): all in one call first when
    ``at_once`` (the enqueue markers make a repeat safe: a rejected call leaves the others'
    appends done, and the pass type by type finds their markers), then type by type. The
    types whose stream Redis rejects, with its error."""
    by_type: dict[str, list[Fire]] = defaultdict(list)
    for fire in fires:
        by_type[fire.type].append(fire)
    return await apart_by_type(
        redis, lambda: append(fires), lambda t: append(by_type[t]), list(by_type), at_once
    )


async def send_cancels(
    redis: RedisClient, cancel: Callable[[Mapping[str, Sequence[str]]], Awaitable[Any]],
    cancels: Mapping[str, Sequence[str]], actor: str,
) -> None:  # fmt: skip
    """``cancel_fires`` for these running fires (by type) that ``cancel_other`` fires
    replaced (``apart_by_type``): all in one call, then, once rejected, type by type (a
    request written again is the same request). A type whose cancel hash Redis rejects (a
    key of another kind) is left out with one ``cancels_not_sent`` line: its replaced fires
    run to their end (or timeout) and their replacements wait for them, as under
    ``buffer_one``, rather than every partition and type the poller serves waiting on that
    one key."""
    rejected = await apart_by_type(
        redis, lambda: cancel(cancels), lambda t: cancel({t: cancels[t]}), list(cancels), True
    )
    for task_type, error in rejected.items():
        get_logger(actor=actor).warning(
            "cancels_not_sent", type=task_type, fires=len(cancels[task_type]),
            error=reply_text(error),
        )  # fmt: skip


async def commit_apart(
    scripts: Scripts, poller: str, token: str, commits: dict[int, list[FireCommit]],
    writes: Mapping[int, int],
) -> tuple[dict[int, Commit], list[PartRejected]]:  # fmt: skip
    """``commit_fires``, riding out outages and refusals; each commit Redis rejects (its
    partition's keys) returned apart, the others done (a try repeated says anew: one that
    went through finds its states)."""
    rejected: list[PartRejected] = []

    async def commit() -> dict[int, Commit]:
        rejected.clear()
        return await scripts.commit_fires(poller, token, commits, writes, rejected)

    return await scripts.client.ride_out(commit), rejected


class Notices:
    """One ``held`` line when a partition's or a type's writes are first rejected (or the
    error changes), one ``resumed`` line once one of those tried again is not."""

    def __init__(self, actor: str, held: str, resumed: str) -> None:
        self.actor = actor
        self.held = held
        self.resumed = resumed
        self._said: dict[str, dict[str, str]] = {}
        """What Redis rejects now, by kind (partition, type), as said (its error)."""

    def say(self, what: str, rejected: Mapping[str, Exception], tried: Iterable[str]) -> None:
        said = self._said.setdefault(what, {})
        if not rejected and not said:  # every tick of a healthy namespace
            return
        tried = set(tried)
        lines: list[tuple[str, dict[str, Any]]] = []
        for name, error in rejected.items():
            if said.get(name) != str(error):
                said[name] = str(error)
                lines.append((self.held, {what: name, "error": str(error)}))
        for name in [n for n in said if n not in rejected and n in tried]:
            del said[name]
            lines.append((self.resumed, {what: name}))
        emit_events(self.actor, lines)

    def forget(self, what: str, name: str) -> None:
        """Say nothing more of ``name`` (no longer this one's to try)."""
        self._said.get(what, {}).pop(name, None)


#: How long a poller leaves out a partition whose calls Redis rejects before trying again.
SET_ASIDE_S = 1.0


class SetAside:
    """The partitions a poller leaves out of its ticks because Redis rejects their calls
    (a key of another kind in them: ``PartRejected``), each tried again ``wait_s`` later:
    one broken partition holds back its own fires only, and costs one claim a second, not
    a call every tick. Said by ``notices`` (``fires_held_back`` with the partition, once;
    ``fires_resumed`` when a tick that tried it again did not set it aside)."""

    def __init__(
        self, notices: Notices, forget: Callable[[int], None], wait_s: float = SET_ASIDE_S
    ) -> None:
        self.notices = notices
        self.forget = forget
        """Drops what the poller knows of a partition set aside (read afresh later)."""
        self.wait_s = wait_s
        self._aside: dict[int, tuple[float, Exception]] = {}
        """Partition -> (trio time it is tried again from, what Redis answered)."""
        self.unsent: dict[int, tuple[str, list[FireCommit], Mapping[int, int]]] = {}
        """Per partition set aside at its commit: that commit (the claim's token, the
        partition's rows, the claim's counts of writes), sent again before the partition is
        claimed again (``commit_again``)."""

    def to_try(self, partitions: list[int], now: float) -> list[int]:
        """``partitions`` but those set aside whose wait is not over."""
        aside = self._aside
        if not aside:
            return partitions
        return [p for p in partitions if p not in aside or aside[p][0] <= now]

    async def run(
        self, tick: Callable[[list[int], set[int]], Awaitable[T]], partitions: list[int]
    ) -> T:
        """``tick(tried, aside)`` over ``partitions`` but those set aside; ``aside`` gathers
        the partitions the tick sets aside, said once it is over (``settle``)."""
        tried = self.to_try(partitions, trio.current_time())
        aside: set[int] = set()
        result = await tick(tried, aside)
        self.settle(tried, aside)
        return result

    def add(self, rejected: PartRejected, aside: set[int]) -> None:
        """Set ``rejected``'s partition aside (into ``aside``, the tick's)."""
        self._aside[rejected.part] = (trio.current_time() + self.wait_s, rejected.error)
        aside.add(rejected.part)
        self.forget(rejected.part)

    def drop(self, partition: int) -> None:
        """Forget ``partition`` (no longer wanted: its next owner tries it, and its claim
        finds in the markers what a commit left unsent had appended)."""
        self._aside.pop(partition, None)
        self.unsent.pop(partition, None)
        self.notices.forget("partition", str(partition))

    async def commit_again(
        self, scripts: Scripts, poller: str, partitions: list[int], aside: set[int],
        log: structlog.typing.FilteringBoundLogger,
    ) -> list[int]:  # fmt: skip
        """``partitions`` less those still set aside: a partition whose commit Redis
        rejected has that commit sent again first (the same claim's: one that partly ran
        finds the states it wrote), and is claimed again only once it went through; its
        fires were appended, so a claim before would append them again."""
        for p in [p for p in partitions if p in self.unsent]:
            token, commits, writes = self.unsent[p]
            done, rejected = await commit_apart(scripts, poller, token, {p: commits}, writes)
            if rejected:
                self.add(rejected[0], aside)
                continue
            del self.unsent[p]
            for task_id in done[p].lost:  # an API write took it meanwhile
                log.warning("claim_lost", task_id=task_id)
        return [p for p in partitions if p not in aside]

    def settle(self, tried: list[int], again: set[int]) -> None:
        """After a tick over ``tried`` that set ``again`` aside: the others tried are taken
        back; say what changed."""
        if not self._aside:
            return
        for p in tried:
            if p not in again:
                self._aside.pop(p, None)
        rejected = {str(p): error for p, (_, error) in self._aside.items()}
        self.notices.say("partition", rejected, map(str, tried))
