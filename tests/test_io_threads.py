"""The worker threads behind every Redis call: results, errors, cancellation, order."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from runtime.io_threads import IOThreads


async def test_returns_results_and_raises_errors() -> None:
    threads = IOThreads(2)
    assert await threads.run(lambda: 41 + 1) == 42
    with pytest.raises(ZeroDivisionError):
        await threads.run(lambda: 1 / 0)
    threads.close()


async def test_calls_run_off_the_trio_thread() -> None:
    threads = IOThreads(1)
    assert await threads.run(threading.get_ident) != threading.get_ident()
    threads.close()


async def test_cancelling_abandons_a_blocked_call_promptly() -> None:
    threads = IOThreads(1)
    release = threading.Event()
    finished = []

    def blocked() -> str:
        release.wait(5)
        finished.append(True)
        return "late"

    started = time.monotonic()
    with trio.move_on_after(0.1):
        await threads.run(blocked)
    assert time.monotonic() - started < 1
    release.set()
    # The abandoned call's result is dropped; the thread serves the next call.
    assert await threads.run(lambda: "next") == "next"
    assert finished == [True]
    threads.close()


async def test_waiting_for_abandoned_calls_ends_when_the_running_one_has_ended() -> None:
    """A caller whose next step must not race a call it gave up on (a poller releasing its
    partitions after an abandoned enqueue) waits until that call has ended; an abandoned
    call that had not started never runs, and is not waited for."""
    threads = IOThreads(1)
    release = threading.Event()
    ran: list[str] = []

    def blocked() -> None:
        release.wait(5)
        ran.append("blocked")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(threads.run, blocked)
        await trio.sleep(0.05)
        nursery.start_soon(threads.run, lambda: ran.append("queued"))
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()  # both abandoned: one running, one queued
    with trio.move_on_after(0.2) as waited:
        await threads.wait_abandoned()
    assert waited.cancelled_caught  # the running one has not ended yet
    release.set()
    with trio.fail_after(5):
        await threads.wait_abandoned()
    assert ran == ["blocked"]
    threads.close()


async def test_at_most_size_calls_run_at_once() -> None:
    threads = IOThreads(3)
    running = 0
    peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(threads.run, work)
    assert peak == 3
    threads.close()


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size must be >= 1"):
        IOThreads(0)
