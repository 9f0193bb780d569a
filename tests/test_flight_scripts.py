"""The scripts of fires in flight called directly against a real Redis: the edge cases a
poller or an operator's call dying half-way leaves behind."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
import trio.testing
import trio_util

from actors.execution.cancels import cancel_requested
from actors.execution.completion import Outcome
from actors.execution.handlers import Handler, HandlerContext
from actors.execution.pool import HandlerPool
from actors.execution.running import Runner
from actors.store.flights import ENDED_DEAD, ENDED_OK, FlightEnd, Planned
from actors.store.keys import Keys
from actors.store.manual_fires import MANUAL_TOKEN
from actors.store.messages import Message
from actors.store.replies import Fire
from actors.store.scripts import Scripts
from runtime.redis_io import RedisClient


@pytest.fixture
def scripts(redis_client: RedisClient, namespace: str) -> Scripts:
    return Scripts(redis_client, Keys(namespace, 1))


async def _exists(scripts: Scripts, task_id: str) -> None:
    """A state record: the task exists."""
    keys = scripts.keys
    await scripts.client.execute("HSET", keys.states(0, keys.bucket_of(task_id)), task_id, b"\0")


async def _record(scripts: Scripts, task_id: str) -> list[str]:
    raw = await scripts.client.execute("HGET", scripts.keys.flights(0), task_id)
    return [] if raw is None else raw.decode().split("|")


async def test_a_fire_never_confirmed_is_appended_again_by_the_next_decision(
    scripts: Scripts,
) -> None:
    """A poller put a fire in flight and died before its append (its claim long
    forgotten): the next claim appends it again instead of skipping behind it forever."""
    await _exists(scripts, "t")
    first = await scripts.decide_overlaps("dead-claim", {0: [Planned("t", "S", [1000])]})
    assert first["t"].run == [(1000, True)]
    later = await scripts.decide_overlaps("next-claim", {0: [Planned("t", "S", [2000])]})
    assert later["t"].run == [(1000, False)]  # again: the enqueue markers drop a copy
    assert later["t"].skipped == [2000] and later["t"].blocking == 1000
    await scripts.confirm_flights("next-claim", ["t"])
    confirmed = await scripts.decide_overlaps("third", {0: [Planned("t", "S", [3000])]})
    assert confirmed["t"].run == [] and confirmed["t"].skipped == [3000]


async def test_a_fire_another_decider_may_still_append_is_left_to_it(
    scripts: Scripts,
) -> None:
    """A poller put a fire in flight and is on its way to append it; an operator's trigger
    decides about the task meanwhile (or the other way round). Appending it again would run
    a skip task's fire twice: within the takeover time it is left to its decider, and
    appended again only once its decider must be gone (or by the same claim sent again)."""
    await _exists(scripts, "t")
    poller = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", "S", [1000])]}, takeover_ms=60_000
    )
    assert poller["t"].run == [(1000, True)]
    trigger = await scripts.decide_overlaps(
        "manual", {0: [Planned("t", "S", [5000])]}, grid=False, takeover_ms=60_000
    )
    assert trigger["t"].run == [] and trigger["t"].skipped == [5000]
    again = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", "S", [1000])]}, takeover_ms=60_000
    )
    assert again["t"].run == [(1000, False)]  # its own claim, sent again
    await scripts.client.execute("HDEL", scripts.keys.flights(0), "t")
    held = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}2", {0: [Planned("t", "S", [6000])]}, grid=False, takeover_ms=60_000
    )
    assert held["t"].run == [(6000, True)]
    claim = await scripts.decide_overlaps(
        "claim-2", {0: [Planned("t", "S", [7000])]}, takeover_ms=60_000
    )
    assert claim["t"].run == [] and claim["t"].skipped == [7000]
    late = await scripts.decide_overlaps("claim-3", {0: [Planned("t", "S", [8000])]}, takeover_ms=0)
    assert late["t"].run == [(6000, False)]  # its decider taken as gone: appended again
    # ... as the operator's fire it is (the policy's letter alone: no catch-up window
    # drops a backfilled grid time as too old)
    assert late["t"].manual == {6000}


async def test_a_fire_held_back_by_an_operator_runs_with_the_letter_alone(
    scripts: Scripts,
) -> None:
    """A backfill's fire waiting behind the one in flight starts later without the task's
    catch-up window (an operator's fire is never too late)."""
    await _exists(scripts, "t")
    await scripts.decide_overlaps("c1", {0: [Planned("t", "B", [1000])]})
    await scripts.confirm_flights("c1", ["t"])
    held = await scripts.decide_overlaps("op", {0: [Planned("t", "B", [10, 20])]}, grid=False)
    assert held["t"].run == [] and held["t"].skipped == []
    await scripts.end_flights([FlightEnd("t", ENDED_OK, 1000)])
    woken = await scripts.decide_overlaps("c2", {0: [Planned("t", "B", [])]})
    assert woken["t"].run == [(10, True)] and woken["t"].manual == {10}


async def test_a_cancel_is_asked_again_until_the_replaced_fire_ends(scripts: Scripts) -> None:
    await _exists(scripts, "t")
    await scripts.decide_overlaps("c1", {0: [Planned("t", "C", [1000])]})
    await scripts.confirm_flights("c1", ["t"])
    replaced = await scripts.decide_overlaps("c2", {0: [Planned("t", "C", [2000])]})
    assert replaced["t"].cancel == [1000] and replaced["t"].run == []
    # c2's poller died before it sent the cancel: the next decision asks again.
    again = await scripts.decide_overlaps("c3", {0: [Planned("t", "C", [3000])]})
    assert again["t"].cancel == [1000] and again["t"].skipped == [2000]
    await scripts.end_flights([FlightEnd("t", 3, 1000)])  # cancelled: the newest starts
    started = await scripts.decide_overlaps("c4", {0: [Planned("t", "C", [])]})
    assert started["t"].run == [(3000, True)] and started["t"].cancel == []


async def test_the_end_of_a_deleted_tasks_fire_keeps_nothing(scripts: Scripts) -> None:
    """No streak, no mark: a task created again under the id starts clean."""
    await scripts.decide_overlaps("c1", {0: [Planned("gone", "S", [1000])]})
    await scripts.end_flights([FlightEnd("gone", ENDED_DEAD, 1000, pause_after=5)])
    assert await _record(scripts, "gone") == []


async def test_an_enqueue_drops_a_fire_any_of_its_prior_claims_appended(
    scripts: Scripts,
) -> None:
    """Two claims never committed before this one: a fire the second appended is found."""
    await scripts.client.execute("XGROUP", "CREATE", scripts.keys.queue("w"), "metronome", "0",
                                 "MKSTREAM")  # fmt: skip
    fire = Fire("t", "w", "{}", 1000)
    assert await scripts.enqueue([fire], 1000, 60_000, "claim-2") == [True]
    again = Fire("t", "w", "{}", 1000, prior="claim-1 claim-2")
    assert await scripts.enqueue([again], 1000, 60_000, "claim-3") == [False]
    assert await scripts.client.execute("XLEN", scripts.keys.queue("w")) == 1


async def _not_run(scripts: Scripts, task_id: str) -> str:
    raw = await scripts.client.execute("HGET", scripts.keys.not_run(0), task_id)
    return "" if raw is None else raw.decode()


@pytest.mark.parametrize("letter", ["A", "S"])
async def test_expired_grid_times_decided_again_are_counted_once(
    scripts: Scripts, letter: str
) -> None:
    """A decision repeated (the same claim sent again after a lost reply, or a task whose
    stream Redis rejects claimed again a lease later with its grid unmoved) sees the same
    expired grid times again: the not-run count ``explain`` shows counts each once."""
    await _exists(scripts, "t")
    await scripts.decide_overlaps("claim", {0: [Planned("t", letter, [5000], [1000, 2000])]})
    assert await _not_run(scripts, "t") == "2 expired 2000 -"
    again = await scripts.decide_overlaps(
        "claim", {0: [Planned("t", letter, [5000], [1000, 2000])]}
    )
    assert await _not_run(scripts, "t") == "2 expired 2000 -"
    # not known as decided: the poller says their not_run lines (a held task's, said by
    # the claim that decides it again, or a repeat after a lost reply)
    assert again["t"].known == frozenset()
    await scripts.decide_overlaps("next", {0: [Planned("t", letter, [], [1000, 2000, 3000])]})
    assert await _not_run(scripts, "t") == "3 expired 3000 -"
    # A later grid decision counts its own expired times (and only those).
    await scripts.decide_overlaps("later", {0: [Planned("t", letter, [], [7000])]})
    assert await _not_run(scripts, "t") == "4 expired 7000 -"


async def test_grid_times_decided_before_are_not_noted_expired_when_planned_again(
    scripts: Scripts,
) -> None:
    """A claim decided three grid times (one in flight, two skipped) and its poller died
    before its commit; the next claim plans them again, now past the catch-up window: they
    were decided (the one in flight, the skipped ones in the history), so none is noted
    expired, and they go back as known (no not_run line). A time below the latest decided
    that none of these holds (owed after a takeover, never decided) is noted."""
    await _exists(scripts, "t")
    first = await scripts.decide_overlaps("c1", {0: [Planned("t", "S", [1000, 2000, 3000])]})
    assert first["t"].skipped == [2000, 3000]
    await scripts.confirm_flights("c1", ["t"])
    again = await scripts.decide_overlaps("c2", {0: [Planned("t", "S", [], [1000, 2000, 3000])]})
    assert again["t"].known == {1000, 2000, 3000}
    assert await _not_run(scripts, "t") == "2 overlap 3000 1000"
    owed = await scripts.decide_overlaps("c3", {0: [Planned("t", "S", [], [500, 3000])]})
    assert owed["t"].known == {3000}
    assert await _not_run(scripts, "t") == "3 expired 500 -"


async def test_a_fire_held_back_while_its_task_was_paused_starts_when_it_resumes(
    redis_client: RedisClient, namespace: str
) -> None:
    """A trigger waits behind the task's fire in flight (buffer_one); the task is paused,
    and the fire ahead ends meanwhile (its end cannot wake a task out of the schedule).
    Resumed, the task is due at once, and its claim starts the waiting fire, rather than
    at its next grid time an hour on."""
    import trio

    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="buffer_one"
    )
    await store.create(TaskSpec("t", hourly, task_id="x"))
    first, queued = await store.trigger("x", "buffer_one")
    assert queued
    await trio.sleep(0.01)  # another due time (a trigger's is its time)
    second, queued = await store.trigger("x", "buffer_one")
    assert not queued  # waits behind the first
    await store.pause("x")
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.end_flights([FlightEnd("x", ENDED_OK, int(first.split(":")[1]))])
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()  # due now, not at its next grid time
    decided = await scripts.decide_overlaps("claim", {0: [Planned("x", "1", [])]})
    assert [d for d, _ in decided["x"].run] == [int(second.split(":")[1])]
    await scripts.confirm_flights("claim", ["x"])  # appended: its commit confirms it
    await store.pause("x")  # nothing waiting now, nothing unconfirmed: onto its grid
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) > await store.now_ms() + 3_000_000


async def test_a_task_resumed_with_an_unconfirmed_fire_in_flight_is_claimed_at_once(
    redis_client: RedisClient, namespace: str
) -> None:
    """A poller put a fire in flight and died before its commit; the task was paused
    meanwhile. Resumed, it is due at once (its claim appends that fire again once its
    decider must be gone), not at its next grid time an hour on."""
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule(
        "interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000, overlap="skip"
    )
    await store.create(TaskSpec("t", hourly, task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()
    await scripts.decide_overlaps("dead-claim", {0: [Planned("x", "S", [1000])]})
    await store.pause("x")
    await store.resume("x")
    score = await redis_client.execute("ZSCORE", keys.schedule(0), "x")
    assert float(score) <= await store.now_ms()


@pytest.mark.parametrize("woken", [True, False], ids=["woken", "parked"])
async def test_a_claim_planning_no_time_of_its_own_leaves_an_unconfirmed_fire_to_its_decider(
    scripts: Scripts, woken: bool
) -> None:
    """A fire another decider put in flight, unconfirmed and within the takeover time, and
    a claim that plans no time (woken before its grid time) or only ends the grid (parked):
    the claim waits, as one that plans the fire's own time does. Deciding then, it
    appended nothing and left the task on its grid (or finished it), so the fire was never
    appended if its decider had died."""
    await _exists(scripts, "t")
    dead = await scripts.decide_overlaps(
        "dead-claim", {0: [Planned("t", "S", [1000, 2000])]}, takeover_ms=60_000
    )
    assert dead["t"].run == [(1000, True)] and dead["t"].skipped == [2000]
    # woken: planned before its next grid time; parked: on the latest grid time decided
    planned = Planned("t", "S", []) if woken else Planned("t", "S", [2000], ends=True)
    held = await scripts.decide_overlaps("claim-2", {0: [planned]}, takeover_ms=60_000)
    assert held["t"].wait_ms is not None and held["t"].run == []
    late = await scripts.decide_overlaps("claim-3", {0: [planned]}, takeover_ms=0)
    assert late["t"].wait_ms is None and late["t"].run == [(1000, False)]


async def test_a_dead_end_written_again_counts_once_in_the_streak(
    redis_client: RedisClient, namespace: str
) -> None:
    """The end of a fire written twice (its reply lost, the write sent again; a poison
    end done again) counts once in the task's dead streak: a task that pauses after two
    dead fires in a row is not paused by one, nor counted again after its pause."""
    from actors.api.task_notes import flight_facts
    from actors.domain.model import TaskSpec
    from actors.domain.schedules import Schedule
    from actors.store.tasks import TaskStore

    store = TaskStore(redis_client, namespace, default_partitions=1)
    hourly = Schedule("interval", every_s=3600, pause_after_failures=2)
    await store.create(TaskSpec("t", hourly, task_id="x"))
    scripts, keys = await store.scripts(), await store.keys()

    def dead(due: int) -> FlightEnd:
        return FlightEnd("x", ENDED_DEAD, due, pause_after=2, error="boom")

    assert await scripts.end_flights([dead(1000)]) == []
    assert await scripts.end_flights([dead(1000)]) == []  # the same end again
    facts = flight_facts(await redis_client.execute("HGET", keys.flights(0), "x"))
    assert facts is not None and facts["dead_streak"] == 1
    assert (await store.get("x")).status == "active"  # type: ignore[union-attr]
    assert await scripts.end_flights([dead(2000)]) == [("x", 2)]
    assert (await store.get("x")).status == "paused"  # type: ignore[union-attr]
    assert await scripts.end_flights([dead(2000)]) == []
    assert flight_facts(await redis_client.execute("HGET", keys.flights(0), "x")) is None
    await store.resume("x")
    assert await scripts.end_flights([dead(3000)]) == []  # a streak of one, afresh
    await scripts.end_flights([FlightEnd("x", ENDED_OK, 4000, pause_after=2)])
    assert await redis_client.execute("HGET", keys.flights(0), "x") is None


@pytest.mark.parametrize("letter", ["1", "S"])
async def test_an_operators_call_on_a_deleted_task_notes_nothing_not_run(
    scripts: Scripts, letter: str
) -> None:
    """A backfill that read its task before it was deleted: its first time goes in flight
    (its end clears the record), the others are not run, and no not-run note is left
    for a task created again under the id to inherit."""
    token = f"{MANUAL_TOKEN}call"
    decided = await scripts.decide_overlaps(
        token, {0: [Planned("gone", letter, [1000, 2000, 3000])]}, grid=False
    )
    assert [d for d, _ in decided["gone"].run] == [1000]
    assert decided["gone"].skipped == [2000, 3000]
    assert await scripts.client.execute("HGET", scripts.keys.not_run(0), "gone") is None


async def test_an_operators_call_leaves_the_waiting_grid_fires_to_the_poller(
    scripts: Scripts,
) -> None:
    """A buffer_all task's fire in flight ended with grid fires waiting and none started
    yet: the task's poller starts them (woken by the end; a paused task's once it
    resumes). An operator's trigger or backfill deciding about the task meanwhile runs its
    own fire, and leaves them waiting: started by the call, a paused task's grid fire
    would run during its pause, appended with the call's code (its origin the operator's,
    without the task's catch-up window or failure count)."""
    await _exists(scripts, "t")
    first = await scripts.decide_overlaps("claim", {0: [Planned("t", "B", [1000, 2000, 3000])]})
    assert first["t"].run == [(1000, True)]
    await scripts.confirm_flights("claim", ["t"])
    await scripts.end_flights([FlightEnd("t", ENDED_OK, 1000)])  # 2000 and 3000 wait
    trigger = await scripts.decide_overlaps(
        f"{MANUAL_TOKEN}1", {0: [Planned("t", "B", [5001])]}, grid=False
    )
    assert trigger["t"].run == [(5001, True)]
    record = await _record(scripts, "t")
    assert "2000" in record[3] and "3000" in record[3]  # still waiting, behind it


async def test_a_cancel_request_is_read_again_until_its_run_is_cancelled(
    scripts: Scripts,
) -> None:
    """A consumer's look-up of cancel requests is repeated whole after a lost reply: it
    must find them again (removed by the look-up itself, the repeat found none and the
    replaced fire ran to its end). They are removed once the runs are cancelled."""
    await scripts.cancel_fires({"t": ["a:1", "b:2"]})
    assert await scripts.cancel_requests("t", ["a:1", "c:3"]) == ["a:1"]
    assert await scripts.cancel_requests("t", ["a:1", "c:3"]) == ["a:1"]  # the repeat
    await scripts.take_cancel_requests("t", ["a:1"])
    assert await scripts.cancel_requests("t", ["a:1", "b:2"]) == ["b:2"]


async def test_a_cancel_request_whose_run_ended_before_it_was_cancelled_stays(
    scripts: Scripts,
) -> None:
    """A consumer looks up the cancel requests of its running fires; one run fails (to be
    retried) while the look-up is on its way. Nothing was cancelled, so the request
    stays: the retry of the replaced fire is cancelled as it starts, not run to its end."""
    await scripts.cancel_fires({"t": ["t0:0"]})
    fail_now, ended = trio.Event(), trio.Event()
    outcomes: list[Outcome] = []

    async def handler(ctx: HandlerContext) -> None:
        await fail_now.wait()
        raise RuntimeError("to be retried")

    def done(outcome: Outcome) -> None:
        outcomes.append(outcome)
        ended.set()

    class EndsWhileLooking(Scripts):
        async def cancel_requests(self, task_type: str, sids: Sequence[str]) -> list[str]:
            found = await super().cancel_requests(task_type, sids)
            fail_now.set()
            await ended.wait()
            return found

    replaced = Message(
        msg_id="1-0", task_id="t0", schedule_id="t0:0", type="t", payload_json="null",
        attempt=0, due_ms=0, enq_ms=0, payload=None, policy="C",
    )  # fmt: skip
    runner = Runner(Handler(name="h", fn=handler, is_async=True), 60, 1)
    looking = EndsWhileLooking(scripts.client, scripts.keys)
    async with trio.open_nursery() as nursery:
        pool = HandlerPool(runner, 1, trio_util.AsyncValue(1), done, nursery, "test")
        pool.submit([replaced])
        await trio.testing.wait_all_tasks_blocked()  # running
        assert await cancel_requested(looking, pool, "t") == []
        nursery.cancel_scope.cancel()
    (outcome,) = outcomes
    assert outcome.not_run is None and outcome.error is not None  # failed, not cancelled
    assert await scripts.cancel_requests("t", ["t0:0"]) == ["t0:0"]
