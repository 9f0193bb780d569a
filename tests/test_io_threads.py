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
