"""Waiting in tests: poll a condition until it holds, with a generous deadline, instead of
sleeping a guessed time. A condition that never holds fails the test, naming what was
waited for; how soon it held is never asserted."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


#: What a failed wait names: a phrase, or a function that describes the state at the time.
What = str | Callable[[], str]


def until(
    predicate: Callable[[], T | None],
    timeout_s: float = 30.0,
    *,
    poll_s: float = 0.02,
    what: What = "",
) -> T:
    """Call ``predicate`` (a blocking call) until it returns something true; return that.
    Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_failed(what, timeout_s))
        time.sleep(poll_s)


async def eventually(
    predicate: Callable[[], Any],
    timeout_s: float = 30.0,
    *,
    poll_s: float = 0.02,
    what: What = "",
) -> Any:
    """``until`` in trio: ``predicate`` may be a coroutine function (a Redis read); it is
    polled on trio's clock, so a test on an autojump ``MockClock`` waits no real time."""
    value = await _poll(predicate, timeout_s, poll_s)
    if not value:
        raise AssertionError(_failed(what, timeout_s))
    return value


async def settled(
    predicate: Callable[[], Any], timeout_s: float = 60.0, *, poll_s: float = 0.1
) -> bool:
    """``eventually``, for a wait whose failure the assertions after it explain better
    (which fires are missing): whether ``predicate`` came to hold within ``timeout_s``."""
    return bool(await _poll(predicate, timeout_s, poll_s))


async def _poll(predicate: Callable[[], Any], timeout_s: float, poll_s: float) -> Any:
    """What ``predicate`` returned last: something true, or false at the deadline."""
    deadline = trio.current_time() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value or trio.current_time() > deadline:
            return value
        await trio.sleep(poll_s)


def _failed(what: What, timeout_s: float) -> str:
    return f"not within {timeout_s} s: {(what() if callable(what) else what) or 'the condition'}"
