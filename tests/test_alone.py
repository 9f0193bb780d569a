"""The process's turn for its suspects (``actors.execution.alone``): while a suspect has it,
nothing else of the process runs, so a death then counts against the suspect alone."""

from __future__ import annotations

import trio
import trio_util

from actors.execution.alone import Alone


async def test_a_turn_waits_for_running_handlers_and_holds_back_every_start() -> None:
    alone = Alone()
    a, b = trio_util.AsyncValue(4), trio_util.AsyncValue(2)
    alone.add_pool(a, 4)
    alone.add_pool(b, 2)
    b.value = 1  # one handler of the other type still running
    events: list[str] = []

    async def suspect() -> None:
        async with alone.turn():
            events.append("suspect runs")
            await trio.sleep(0.05)
            events.append("suspect settled")

    async def other_start() -> None:
        await trio.sleep(0.01)  # once the turn is asked for
        await alone.wait_to_start()
        events.append("other starts")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(suspect)
        nursery.start_soon(other_start)
        await trio.sleep(0.03)
        assert events == []  # the running handler first; no start meanwhile
        events.append("running handler ends")
        b.value = 2
    assert events == ["running handler ends", "suspect runs", "suspect settled", "other starts"]


async def test_turns_come_one_at_a_time_and_a_cancelled_one_opens_the_process() -> None:
    alone = Alone()
    inside = 0
    most = 0

    async def suspect() -> None:
        nonlocal inside, most
        async with alone.turn():
            inside += 1
            most = max(most, inside)
            await trio.sleep(0.01)
            inside -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(suspect)
    assert most == 1
    with trio.move_on_after(0.01):
        async with alone.turn():
            await trio.sleep_forever()
    with trio.fail_after(1):
        await alone.wait_to_start()  # cancelled: the process is open again


async def test_a_turn_does_not_wait_on_a_consumer_that_stopped() -> None:
    """A consumer that stops with handlers still counted (crashed, its name lost) is
    forgotten: the turn goes on rather than hold every type until it restarts."""
    alone = Alone()
    free = trio_util.AsyncValue(0)  # its slots never come back
    alone.add_pool(free, 2)
    entered = trio.Event()

    async def suspect() -> None:
        async with alone.turn():
            entered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(suspect)
        await trio.sleep(0.02)
        assert not entered.is_set()
        alone.forget_pool(free)
        with trio.fail_after(5):
            await entered.wait()
