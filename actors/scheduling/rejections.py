"""A type's stream that Redis rejects holds back that type's fires only.

Redis rejects a call as it was sent (``rejected_alone``: a stream key holding another kind
of value, ``WRONGTYPE``) for as long as the key stays so. Waited on like an outage, one
broken stream would hold up every type the poller and the retry dispatcher serve. So both
append the fires of a tick type by type once a call is rejected, and go on with every
type whose stream takes them (``append_by_type``); what they do with the fires held back
is theirs (the retry dispatcher leaves them claimed, the poller moves their tasks a claim
lease on with their grid where it was). ``Notices`` says each rejection once, and when it
is over.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from actors.store.replies import Fire
from runtime.logging import emit_events
from runtime.redis_io import RedisClient, ResponseError
from runtime.redis_replies import rejected_alone

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


async def append_by_type(
    redis: RedisClient,
    append: Callable[[list[Fire]], Awaitable[Any]],
    fires: list[Fire],
    at_once: bool,
) -> dict[str, ResponseError]:
    """Append ``fires`` with ``append``, riding out outages and refusals: all in one call
    first when ``at_once`` (the enqueue markers make a repeat safe: a rejected call leaves
    the others' appends done, and the pass type by type finds their markers), then, if that
    was rejected or not ``at_once``, type by type, each once. The types whose stream Redis
    rejects, with its error."""
    by_type: dict[str, list[Fire]] = defaultdict(list)
    for fire in fires:
        by_type[fire.type].append(fire)
    if at_once or len(by_type) == 1:
        try:
            await redis.ride_out(functools.partial(unless_rejected, lambda: append(fires)))
            return {}
        except Rejected as exc:
            if len(by_type) == 1:
                return {fires[0].type: exc.error}
    rejected: dict[str, ResponseError] = {}
    for task_type, group in by_type.items():
        try:
            await redis.ride_out(
                functools.partial(unless_rejected, functools.partial(append, group))
            )
        except Rejected as exc:
            rejected[task_type] = exc.error
    return rejected


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
