"""The overlap scripts against a model: random policies, handler durations, outcomes and
crashes (a poller killed before or after its enqueue) driven through ``overlap.lua`` and
``end_flights.lua`` on a real Redis, with the stream and the consumers simulated around
them. Whatever happens, a task never has two fires running at once, no grid time runs
twice, nothing is left stranded once the runs end, and ``buffer_all`` runs every grid time
in order."""

from __future__ import annotations

import secrets
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.store.flights import (
    ENDED_CANCELLED,
    ENDED_DEAD,
    ENDED_DROPPED,
    ENDED_OK,
    LETTERS,
    FlightEnd,
    Planned,
    _decision,
)
from actors.store.keys import Keys
from actors.store.scripts import Scripts
from runtime.config import RedisSection
from runtime.redis_io import RedisClient

TASK = "t"
FAR = 10**13
POLICIES = ["skip", "buffer_one", "buffer_all", "cancel_other"]

#: A step: a grid time comes ("tick", and where the poller dies: None, "before" or
#: "after" its enqueue), or the oldest running fire ends ("end", dead or not).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.sampled_from([None, None, None, "before", "after"])),
        st.tuples(st.just("end"), st.booleans()),
    ),
    min_size=1,
    max_size=40,
)


@attrs.define
class World:
    """The stream and the consumers around the scripts."""

    scripts: Scripts
    letter: str
    grid: int = 0
    owed: list[int] = attrs.field(factory=list)
    """Grid times a dead poller claimed and never committed: claimed again."""
    appended: set[int] = attrs.field(factory=set)
    running: list[int] = attrs.field(factory=list)
    runs: list[int] = attrs.field(factory=list)
    cancelled: set[int] = attrs.field(factory=set)

    @property
    def keys(self) -> Keys:
        return self.scripts.keys

    async def claim(self, dues: list[int], crash: str | None) -> None:
        token = f"c{secrets.token_hex(4)}"
        planned = {0: [Planned(TASK, self.letter, dues)]}
        decision = (await self.scripts.decide_overlaps(token, planned))[TASK]
        if crash == "before":  # the claim is never committed: its grid times come again
            self.owed = dues
            return
        for due in decision.cancel:  # a cancel reaches the run at once here
            if due in self.running:
                await self.end(due, ENDED_CANCELLED)
                self.cancelled.add(due)
        for due, fresh in decision.run:
            if due in self.appended:  # the enqueue markers drop a copy
                if fresh:
                    await self.scripts.end_flights([FlightEnd(TASK, ENDED_DROPPED, due)])
                continue
            self.appended.add(due)
            self.running.append(due)
            self.runs.append(due)
        if crash == "after":
            self.owed = dues
        else:  # the commit confirms the appends its claim decided
            await self.scripts.confirm_flights(token, [TASK])
            self.owed = []

    async def tick(self, crash: str | None) -> None:
        self.grid += 1
        await self.claim([*self.owed, self.grid], crash)

    async def end(self, due: int, ended: int) -> None:
        self.running.remove(due)
        await self.scripts.end_flights([FlightEnd(TASK, ended, due)])

    async def woken(self) -> bool:
        score = await self.scripts.client.execute("ZSCORE", self.keys.schedule(0), TASK)
        return float(score) < FAR

    async def wake(self) -> None:
        """The poller claims a task an end woke (nothing due on its grid)."""
        while await self.woken():
            await self.scripts.client.execute("ZADD", self.keys.schedule(0), FAR, TASK)
            await self.claim(list(self.owed), None)

    async def record(self) -> tuple[str, list[str]]:
        raw = await self.scripts.client.execute("HGET", self.keys.flights(0), TASK)
        fields = (raw or b"|||||").decode().split("|")
        return fields[0], [w for w in fields[3].split(",") if w]


async def _simulate(redis_url: str, policy: str, plan: list[tuple[str, Any]]) -> World:
    client = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
    try:
        keys = Keys(f"m{secrets.token_hex(4)}", 1)
        world = World(Scripts(client, keys), LETTERS[policy])
        await client.execute("ZADD", keys.schedule(0), FAR, TASK)
        # A state record: the task exists (an end of a deleted task's fire keeps nothing).
        await client.execute("HSET", keys.states(0, keys.bucket_of(TASK)), TASK, b"\x00")
        for kind, arg in plan:
            if kind == "tick":
                await world.tick(arg)
            elif world.running:
                await world.end(world.running[0], ENDED_DEAD if arg else ENDED_OK)
            await world.wake()
            # Never two of the task's fires running at once.
            assert len(world.running) <= 1, world.running
            inflight, _ = await world.record()
            if world.running and not world.owed:
                assert inflight == str(world.running[0])
        # The poller recovers from its last crash, then every run ends.
        if world.owed:
            await world.claim(list(world.owed), None)
            await world.wake()
        while world.running:
            await world.end(world.running[0], ENDED_OK)
            await world.wake()
        inflight, waiting = await world.record()
        assert (inflight, waiting) == ("", []), "stranded"
        return world
    finally:
        await client.aclose()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), plan=steps)
def test_random_runs_crashes_and_ends_against_the_model(
    redis_url: str, policy: str, plan: list[tuple[str, Any]]
) -> None:
    world = trio.run(_simulate, redis_url, policy, plan)
    runs = world.runs
    assert len(runs) == len(set(runs)), f"a grid time ran twice: {runs}"
    assert all(1 <= due <= world.grid for due in runs)
    if policy == "buffer_all":
        assert runs == list(range(1, world.grid + 1))  # every grid time, in order
    if policy == "buffer_one":
        assert runs == sorted(runs)
    if policy == "skip":
        # A grid time is skipped only while another runs: the first always runs, and a run
        # ends before the next starts (checked above), so runs go up.
        assert runs[:1] == ([1] if world.grid else []) and runs == sorted(runs)
    if policy == "cancel_other":
        assert runs == sorted(runs)
        # Every fire but the last one to start was cancelled or ended on its own first.
        assert not world.cancelled - set(runs)


def test_a_decision_naming_a_fire_in_flight_that_is_not_a_time_is_read_without_it() -> None:
    """A flight record edited by hand (its fire in flight ``abc``): the decision that
    skips a grid time for it names it as blocking; it is read as none, not a ValueError
    that would fail the poller's tick, and every time that is one is kept."""
    decision = _decision([b"t", b"5,r6,m7", b"abc", b"8,abc", b"abc", b"", b"-20"])
    assert decision.run == [(5, True), (6, False), (7, True)]
    assert decision.manual == frozenset({7})
    assert (decision.cancel, decision.skipped, decision.blocking) == ([], [8], None)
    assert (decision.park, decision.wait_ms) == (None, -20)
