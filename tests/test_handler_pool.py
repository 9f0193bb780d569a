"""The handler pool (actors/execution/pool.py) on its own: no Redis, real trio tasks.

What it must keep from one task a message: runs are concurrent up to the pool's size, each
is cut at its own timeout (never a neighbour's), a slot is given back whatever happens, and
cancelling the pool (the node stopping) ends every run without an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import AsyncIterator, Callable

import pytest
import trio
import trio.testing
import trio_util

from actors.execution.completion import Outcome
from actors.execution.handlers import (
    Handler,
    HandlerContext,
    RetryLater,
    Unrecoverable,
    resolve,
)
from actors.execution.pool import HandlerPool
from actors.execution.running import Runner
from actors.store.messages import Message
from actors.store.queue_rows import short_error_line


def message(n: int, sleep_s: float = 0) -> Message:
    """A message whose payload tells the handler how long to sleep."""
    return Message(
        msg_id=f"1-{n}", task_id=f"t{n}", schedule_id=f"t{n}:0", type="t",
        payload_json=str(sleep_s), attempt=0, due_ms=0, enq_ms=0, payload=sleep_s,
    )  # fmt: skip


class Harness:
    def __init__(self, fn: object, *, size: int, timeout_s: float) -> None:
        handler = Handler(name="t", fn=fn, is_async=True)  # type: ignore[arg-type]
        self.runner = Runner(handler, timeout_s, size)
        self.free = trio_util.AsyncValue(size)
        self.outcomes: list[Outcome] = []
        self.size = size

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HandlerPool]:
        """A pool and its watchdog, cancelled (as when the node stops) when the block ends."""
        async with trio.open_nursery() as nursery:
            pool = HandlerPool(
                self.runner, self.size, self.free, self.outcomes.append, nursery, "test"
            )
            nursery.start_soon(pool.watch_timeouts)
            yield pool
            nursery.cancel_scope.cancel()

    async def run_all(self, pool: HandlerPool, messages: list[Message]) -> None:
        """Submit ``messages`` and wait until every slot is free again."""
        pool.submit(messages)
        await self.free.wait_value(self.size)

    def by_task(self) -> dict[str, Outcome]:
        return {o.message.task_id: o for o in self.outcomes}


async def test_runs_are_concurrent_up_to_the_size_and_give_their_slots_back() -> None:
    running, most = 0, 0
    release = trio.Event()

    async def handler(ctx: HandlerContext) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return ctx.task_id

    h = Harness(handler, size=4, timeout_s=60)
    async with h.running() as pool:
        pool.submit([message(i) for i in range(4)])
        assert h.free.value == 0
        await trio.testing.wait_all_tasks_blocked()
        assert running == 4
        release.set()
        await h.free.wait_value(4)
        # the workers are reused: a second batch runs on them
        await h.run_all(pool, [message(i) for i in range(4, 8)])
    assert most == 4
    assert sorted(o.result for o in h.outcomes) == [f"t{i}" for i in range(8)]
    assert all(o.error is None for o in h.outcomes)


async def test_a_timeout_cuts_only_the_run_that_outlived_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cancelled_at: dict[str, float] = {}

    async def handler(ctx: HandlerContext) -> str:
        try:
            await trio.sleep(ctx.payload)
        except trio.Cancelled:
            cancelled_at[ctx.task_id] = trio.current_time()
            raise
        return "done"

    h = Harness(handler, size=3, timeout_s=10)
    start = trio.current_time()
    async with h.running() as pool:
        pool.submit([message(0, sleep_s=100), message(1, sleep_s=1)])
        await trio.sleep(5)  # started 5 s after the first two: its deadline is later
        pool.submit([message(2, sleep_s=9)])
        await h.free.wait_value(3)
        # the worker the timeout cancelled runs the next message under a fresh scope
        await h.run_all(pool, [message(3, sleep_s=2)])
    runs = h.by_task()
    assert runs["t0"].error == "timeout: handler ran longer than 10s"
    assert list(cancelled_at) == ["t0"]
    assert cancelled_at["t0"] - start == 10  # at its own deadline, not a later run's
    assert runs["t1"].result == "done" and runs["t1"].error is None
    assert runs["t2"].result == "done" and runs["t2"].error is None  # ran 9 s of its 10
    assert runs["t3"].result == "done"


async def test_a_handler_that_swallows_its_timeout_still_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def handler(ctx: HandlerContext) -> str:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            return "pretended to finish"
        return "done"

    h = Harness(handler, size=1, timeout_s=1)
    async with h.running() as pool:
        await h.run_all(pool, [message(0)])
    assert [o.error for o in h.outcomes] == ["timeout: handler ran longer than 1s"]


async def test_cancelling_the_pool_ends_runs_without_outcomes_and_frees_their_slots() -> None:
    async def handler(ctx: HandlerContext) -> None:
        await trio.sleep_forever()

    h = Harness(handler, size=5, timeout_s=60)
    async with h.running() as pool:
        pool.submit([message(i) for i in range(3)])
        await trio.testing.wait_all_tasks_blocked()
        assert h.free.value == 2
    assert h.free.value == 5
    assert h.outcomes == []  # unfinished: left in flight, released by the consumer


async def test_failures_become_outcomes_and_the_worker_goes_on() -> None:
    async def handler(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            raise ValueError("bad payload")
        return "ok"

    h = Harness(handler, size=1, timeout_s=60)
    async with h.running() as pool:
        await h.run_all(pool, [message(0)])
        await h.run_all(pool, [message(1)])
    runs = h.by_task()
    assert runs["t0"].error is not None and "ValueError: bad payload" in runs["t0"].error
    assert runs["t1"].result == "ok"


async def test_a_run_after_a_long_quiet_spell_is_still_cut_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With nothing running the watchdog waits for the next run: that run must wake it."""
    cancelled_at: list[float] = []

    async def handler(ctx: HandlerContext) -> None:
        try:
            await trio.sleep(ctx.payload)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            raise

    h = Harness(handler, size=2, timeout_s=1)
    async with h.running() as pool:
        await h.run_all(pool, [message(0, sleep_s=0.5)])  # the watchdog has seen a run end
        await trio.sleep(3600)
        start = trio.current_time()
        await h.run_all(pool, [message(1, sleep_s=100)])
    assert cancelled_at == [start + 1]
    assert [o.error for o in h.outcomes] == [None, "timeout: handler ran longer than 1s"]


class _Gate:
    """A handler that counts its runs under way and waits until the gate opens."""

    def __init__(self) -> None:
        self.running = 0
        self._open = trio.Event()

    async def handler(self, ctx: HandlerContext) -> str:
        self.running += 1
        await self._open.wait()
        return ctx.task_id

    def open(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.running = 0
        self._open = trio.Event()


async def _park(h: Harness, pool: HandlerPool, gate: _Gate, workers: int) -> None:
    """Start ``workers`` workers (runs that wait, behind ``gate``), then let their runs
    end: those workers are parked afterwards."""
    pool.submit([message(i) for i in range(workers)])
    await trio.testing.wait_all_tasks_blocked()
    assert gate.running == workers
    gate.open()
    await h.free.wait_value(h.size)
    await trio.testing.wait_all_tasks_blocked()
    gate.close()


class _Wakes(trio.abc.Instrument):
    """Counts how often trio schedules any task (a wake from a park included)."""

    def __init__(self) -> None:
        self.scheduled = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.scheduled += 1


async def test_a_batch_of_handlers_that_never_wait_costs_a_few_wakes_not_one_each() -> None:
    """A handler that returns without waiting lets its worker run the whole batch: the
    pool wakes a few workers a batch, not one a message (each wake is CPU a fire)."""

    async def handler(ctx: HandlerContext) -> str:
        return ctx.task_id

    gate = _Gate()
    h = Harness(gate.handler, size=200, timeout_s=60)
    async with h.running() as pool:
        await _park(h, pool, gate, 200)
        h.runner.handler = Handler(name="t", fn=handler, is_async=True)
        wakes = _Wakes()
        trio.lowlevel.add_instrument(wakes)
        try:
            for batch in range(5):
                await h.run_all(pool, [message(1000 + batch * 100 + i) for i in range(100)])
                await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(wakes)
    assert len(h.outcomes) == 200 + 500
    assert sorted(o.result for o in h.outcomes[200:]) == sorted(f"t{1000 + i}" for i in range(500))
    # this test's own task is scheduled too; the workers are woken a few times a batch
    assert wakes.scheduled <= 5 * 6


async def test_runs_that_wait_all_start_though_each_batch_wakes_one_worker() -> None:
    """Woken workers wake others: every run of a large batch starts, on old workers and
    new ones alike, while the first runs are still waiting."""
    gate = _Gate()
    h = Harness(gate.handler, size=500, timeout_s=60)
    async with h.running() as pool:
        await _park(h, pool, gate, 100)
        pool.submit([message(i) for i in range(100, 437)])  # 100 parked, 237 new
        await trio.testing.wait_all_tasks_blocked()
        assert gate.running == 337
        assert h.free.value == 500 - 337
        gate.open()
        await h.free.wait_value(500)
    assert sorted(o.result for o in h.outcomes) == sorted(f"t{i}" for i in range(437))


class _Passes(trio.abc.Instrument):
    """Counts the run loop's passes (each ends in a check for I/O)."""

    def __init__(self) -> None:
        self.passes = 0

    def after_io_wait(self, timeout: float) -> None:
        self.passes += 1


async def test_a_batch_of_waiting_runs_starts_on_parked_workers_in_a_few_passes() -> None:
    """Every run of a batch starts while the first ones wait, and the wakes fan out: a
    worker a pass would take as many passes as the batch has messages."""
    gate = _Gate()
    h = Harness(gate.handler, size=64, timeout_s=60)
    async with h.running() as pool:
        await _park(h, pool, gate, 64)
        for batch in ([100, 101], list(range(200, 264))):
            passes = _Passes()
            trio.lowlevel.add_instrument(passes)
            pool.submit([message(i) for i in batch])
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.remove_instrument(passes)
            assert gate.running == len(batch)
            assert passes.passes <= 2 * len(batch).bit_length() + 2
            gate.open()
            await h.free.wait_value(64)
            gate.close()


async def test_a_batch_of_waiting_runs_wakes_one_worker_a_run() -> None:
    """A fan-out counts the workers already on their way: a batch of runs that wait wakes
    as many parked workers as it has runs, not one that finds the queue empty beside each."""
    gate = _Gate()
    h = Harness(gate.handler, size=300, timeout_s=60)
    async with h.running() as pool:
        await _park(h, pool, gate, 300)
        for batch in (list(range(1000, 1003)), list(range(2000, 2100))):
            wakes = _Wakes()
            trio.lowlevel.add_instrument(wakes)
            try:
                pool.submit([message(i) for i in batch])
                await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(wakes)
            assert gate.running == len(batch)
            # one wake a run, and this test's own task's (the watchdog sleeps on until the
            # deadline of an earlier run); the pool before this count woke 5 and 199
            assert wakes.scheduled <= len(batch) + 1
            gate.open()
            await h.free.wait_value(300)
            gate.close()
    assert sorted(o.result for o in h.outcomes[300:]) == sorted(
        f"t{i}" for i in [*range(1000, 1003), *range(2000, 2100)]
    )


async def test_a_handler_gets_its_fire_in_its_context() -> None:
    seen: list[HandlerContext] = []

    async def handler(ctx: HandlerContext) -> None:
        seen.append(ctx)

    h = Harness(handler, size=1, timeout_s=60)
    fire = Message(
        msg_id="7-1", task_id="report", schedule_id="report:5000", type="reports",
        payload_json='{"to":"ops"}', attempt=2, due_ms=5000, enq_ms=5001, payload={"to": "ops"},
    )  # fmt: skip
    async with h.running() as pool:
        await h.run_all(pool, [fire])
    expected = HandlerContext(
        task_id="report", schedule_id="report:5000", type="reports", payload={"to": "ops"},
        attempt=2, due_ms=5000, actor="test",
    )  # fmt: skip
    assert seen == [expected]


class _OutsideException(BaseException):
    """An error that is not an ``Exception`` (as ``asyncio.CancelledError`` is not)."""


def _raising(exc: BaseException) -> Callable[[], None]:
    def raise_it() -> None:
        raise exc

    return raise_it


async def _in_task(fn: Callable[[], object]) -> None:
    fn()


@pytest.mark.parametrize(
    ("direct", "in_nursery", "on_thread", "shown"),
    [
        pytest.param(
            functools.partial(sys.exit, 2), functools.partial(sys.exit, "bad usage"),
            functools.partial(sys.exit, 3),
            ("SystemExit: 2", "SystemExit: bad usage", "SystemExit: 3"), id="sys-exit",
        ),
        pytest.param(
            _raising(asyncio.CancelledError()), _raising(_OutsideException("odd")),
            _raising(asyncio.CancelledError()),
            ("CancelledError", "_OutsideException: odd", "CancelledError"), id="outside-exception",
        ),
    ],
)  # fmt: skip
async def test_a_handler_error_outside_exception_fails_its_run_and_the_worker_goes_on(
    direct: Callable[[], object], in_nursery: Callable[[], object],
    on_thread: Callable[[], object], shown: tuple[str, str, str],
) -> None:  # fmt: skip
    """``sys.exit()`` in a handler (a command-line tool's main called as a function), or
    another error that is not an ``Exception`` (``asyncio.CancelledError`` from an event
    loop the handler ran), raised by an async handler, from a task of its own nursery or on
    a plain handler's thread, fails that run: it never reaches the node's supervisors,
    whose node would die, take the message back at its restart and die again, never
    counting it poison."""

    async def raises(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            direct()
        if ctx.task_id == "t1":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_in_task, in_nursery)
        return "ok"

    def raises_on_its_thread(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            on_thread()
        return "ok"

    h = Harness(raises, size=1, timeout_s=60)
    async with h.running() as pool:
        await h.run_all(pool, [message(0), message(1), message(2)])
    runs = h.by_task()
    assert runs["t0"].error is not None and shown[0] in runs["t0"].error
    assert runs["t1"].error is not None and shown[1] in runs["t1"].error
    assert runs["t2"].result == "ok"
    threaded = Harness(raises_on_its_thread, size=1, timeout_s=60)
    threaded.runner.handler = Handler(name="t", fn=raises_on_its_thread, is_async=False)
    async with threaded.running() as pool:
        await threaded.run_all(pool, [message(0), message(1)])
    runs = threaded.by_task()
    assert runs["t0"].error is not None and shown[2] in runs["t0"].error
    assert runs["t1"].result == "ok"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, GeneratorExit])
async def test_ctrl_c_raised_by_a_plain_handler_on_its_thread_fails_its_run(
    raised: type[BaseException],
) -> None:
    """No signal reaches a worker thread: a ``KeyboardInterrupt`` (or ``GeneratorExit``)
    out of a plain handler's thread was raised by the handler, and fails its run like any
    of its errors. Let through, it stopped the node, and every node that took the message
    over after it."""

    def raises_on_its_thread(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            raise raised()
        return "ok"

    threaded = Harness(raises_on_its_thread, size=1, timeout_s=60)
    threaded.runner.handler = Handler(name="t", fn=raises_on_its_thread, is_async=False)
    async with threaded.running() as pool:
        await threaded.run_all(pool, [message(0), message(1)])
    runs = threaded.by_task()
    assert runs["t0"].error is not None and f"{raised.__name__} raised by" in runs["t0"].error
    assert runs["t1"].result == "ok"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, GeneratorExit])
async def test_ctrl_c_raised_by_an_async_handler_fails_its_run(raised: type[BaseException]) -> None:
    """The node receives SIGINT itself, so trio never raises ``KeyboardInterrupt`` in a
    task: one out of an async handler (or a ``GeneratorExit``, which trio never throws
    into a running task), bare or from the handler's nursery, is the handler's own, and
    fails its run. Let through, it ended the node, and every node that took the message
    over after it, until the message counted as poison."""

    async def handler(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            raise raised()
        if ctx.task_id == "t1":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_raise, raised())
        return "ok"

    h = Harness(handler, size=1, timeout_s=60)
    async with h.running() as pool:
        await h.run_all(pool, [message(0), message(1), message(2)])
    runs = h.by_task()
    assert runs["t0"].error is not None and raised.__name__ in runs["t0"].error
    assert runs["t1"].error is not None and raised.__name__ in runs["t1"].error
    assert runs["t2"].result == "ok"


async def _raise(exc: BaseException) -> None:
    raise exc


async def test_retry_later_and_unrecoverable_raised_in_a_handlers_nursery_are_heeded() -> None:
    """trio wraps the errors of a handler's nursery in a group: ``RetryLater`` raised in
    one still retries after the delay it asks (the longest of several), ``Unrecoverable``
    still dead-letters at once, and the error told is the raised one's, not the group's
    border line. Another error beside a ``RetryLater`` fails the run as any error."""

    async def raise_in(*errors: BaseException) -> None:
        async def child(exc: BaseException) -> None:
            raise exc

        async with trio.open_nursery() as nursery:
            for exc in errors:
                nursery.start_soon(child, exc)

    async def handler(ctx: HandlerContext) -> str:
        if ctx.task_id == "t0":
            await raise_in(RetryLater(600, "rate limited"))
        if ctx.task_id == "t1":
            await raise_in(RetryLater(60), RetryLater(900, "the slowest"))
        if ctx.task_id == "t2":
            await raise_in(Unrecoverable("no such account"), RetryLater(60))
        if ctx.task_id == "t3":
            await raise_in(RetryLater(60), ValueError("bad row"))
        return "ok"

    h = Harness(handler, size=1, timeout_s=60)
    async with h.running() as pool:
        await h.run_all(pool, [message(i) for i in range(4)])
    runs = h.by_task()
    assert (runs["t0"].retry_after_s, runs["t0"].unrecoverable) == (600, False)
    assert (
        short_error_line(runs["t0"].error) == "actors.execution.handlers.RetryLater: rate limited"
    )
    assert runs["t1"].retry_after_s == 900 and "the slowest" in short_error_line(runs["t1"].error)
    assert runs["t2"].unrecoverable and runs["t2"].retry_after_s is None
    assert short_error_line(runs["t2"].error).endswith("Unrecoverable: no such account")
    assert (runs["t3"].retry_after_s, runs["t3"].unrecoverable) == (None, False)
    assert short_error_line(runs["t3"].error) == "ValueError: bad row"


async def test_an_async_callable_object_and_a_coroutine_from_a_plain_handler_run() -> None:
    """A handler object with an async ``__call__`` is run as async; a plain function that
    returns a coroutine (a sync wrapper of an async handler) has it awaited: each ran on
    a worker thread, and trio refused the coroutine, failing every fire with an error
    that named no handler."""
    for name, is_async in (("async_callable", True), ("returns_a_coroutine", False)):
        handler = resolve("t", f"tests.handlers.jobs:{name}")
        assert handler.is_async is is_async
        h = Harness(handler.fn, size=1, timeout_s=60)
        h.runner.handler = handler
        async with h.running() as pool:
            await h.run_all(pool, [message(0)])
        (outcome,) = h.outcomes
        assert (outcome.error, outcome.result) == (None, "object t0"), name


async def test_a_handler_exiting_as_its_timeout_cuts_it_times_out() -> None:
    """A task of the handler's own nursery calls ``sys.exit()`` as the timeout cancels the
    run (a cleanup that exits): the run times out, and the exit goes no further."""

    async def exits_when_cut(ctx: HandlerContext) -> str:
        async def child() -> None:
            try:
                await trio.sleep_forever()
            finally:
                sys.exit("cut")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            await trio.sleep_forever()
        return "never"

    h = Harness(exits_when_cut, size=1, timeout_s=0.05)
    async with h.running() as pool:
        await h.run_all(pool, [message(0)])
    (outcome,) = h.outcomes
    assert outcome.error is not None and outcome.error.startswith("timeout")
