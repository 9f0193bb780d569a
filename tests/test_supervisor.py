"""Supervision semantics, on trio's autojump MockClock: no test really sleeps."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from runtime.actor import ActorContext, TaskStatus
from runtime.errors import RestartAttemptsExceeded, RestartIntensityExceeded
from runtime.intensity import backoff_s, record_restart
from runtime.logging import get_logger
from runtime.supervisor import ChildSpec, Restart, Strategy, SupervisorSpec, supervisor

Journal = list[tuple[str, str, float]]


def recorder(journal: Journal, name: str, behaviour: Callable[[int], Any] | None = None) -> Any:
    """An actor that journals start/stop; ``behaviour(n)`` for its n-th start (0-based) may
    return "crash", "exit" or "crash_before_ready"; anything else runs until cancelled."""
    starts = 0

    async def run(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        nonlocal starts
        n, starts = starts, starts + 1
        action = behaviour(n) if behaviour else None
        if action == "crash_before_ready":
            journal.append(("start_failed", name, trio.current_time()))
            raise RuntimeError(f"{name} could not start")
        journal.append(("start", name, trio.current_time()))
        task_status.started()
        try:
            await trio.sleep(1)
            if action == "crash":
                raise RuntimeError(f"{name} crashed")
            if action == "exit":
                return
            await trio.sleep_forever()
        finally:
            journal.append(("stop", name, trio.current_time()))

    return run


def root_ctx() -> ActorContext:
    return ActorContext("node", 5.0, get_logger(actor="node"))


def starts_of(journal: Journal, name: str) -> list[float]:
    return [t for kind, who, t in journal if kind == "start" and who == name]


def events(journal: Journal) -> list[tuple[str, str]]:
    return [(kind, who) for kind, who, _ in journal]


async def run_for(spec: ChildSpec, seconds: float) -> ActorContext:
    ctx = root_ctx()
    async with trio.open_nursery() as nursery:
        await nursery.start(spec.run, ctx)
        await trio.sleep(seconds)
        ctx.stop_requested.value = True
    return ctx


def crash_first(n: int) -> str | None:
    return "crash" if n == 0 else None


async def test_one_for_one_restarts_only_the_failed_child(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec(n, recorder(journal, n, crash_first if n == "b" else None)) for n in "abc"],
        SupervisorSpec(Strategy.ONE_FOR_ONE),
    )
    await run_for(tree, 10)
    assert len(starts_of(journal, "a")) == 1
    assert len(starts_of(journal, "b")) == 2
    assert len(starts_of(journal, "c")) == 1


async def test_one_for_all_restarts_every_child_in_start_order(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec(n, recorder(journal, n, crash_first if n == "b" else None)) for n in "abc"],
        SupervisorSpec(Strategy.ONE_FOR_ALL),
    )
    await run_for(tree, 10)
    after_crash = events(journal)[journal.index(("stop", "b", 1.0)) :]
    assert after_crash[:6] == [
        ("stop", "b"),
        ("stop", "c"),  # siblings stop in reverse start order
        ("stop", "a"),
        ("start", "a"),  # and start again in order
        ("start", "b"),
        ("start", "c"),
    ]


async def test_rest_for_one_restarts_the_failed_child_and_those_after_it(
    autojump_clock: Any,
) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec(n, recorder(journal, n, crash_first if n == "b" else None)) for n in "abcd"],
        SupervisorSpec(Strategy.REST_FOR_ONE),
    )
    await run_for(tree, 10)
    assert [len(starts_of(journal, n)) for n in "abcd"] == [1, 2, 2, 2]
    after_crash = events(journal)[journal.index(("stop", "b", 1.0)) :]
    assert after_crash[:6] == [
        ("stop", "b"),
        ("stop", "d"),
        ("stop", "c"),
        ("start", "b"),
        ("start", "c"),
        ("start", "d"),
    ]


@pytest.mark.parametrize(
    ("restart", "action", "expected_starts"),
    [
        (Restart.PERMANENT, "exit", 2),
        (Restart.PERMANENT, "crash", 2),
        (Restart.TRANSIENT, "exit", 1),
        (Restart.TRANSIENT, "crash", 2),
        (Restart.TEMPORARY, "exit", 1),
        (Restart.TEMPORARY, "crash", 1),
    ],
)
async def test_restart_type_decides_whether_an_exit_is_restarted(
    autojump_clock: Any, restart: Restart, action: str, expected_starts: int
) -> None:
    journal: Journal = []
    first_only = {0: action}.get
    tree = supervisor("sup", [ChildSpec("x", recorder(journal, "x", first_only), restart=restart)])
    await run_for(tree, 10)
    assert len(starts_of(journal, "x")) == expected_starts


async def test_temporary_child_stopped_by_a_sibling_restart_is_not_restarted(
    autojump_clock: Any,
) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [
            ChildSpec("a", recorder(journal, "a", crash_first)),
            ChildSpec("t", recorder(journal, "t"), restart=Restart.TEMPORARY),
        ],
        SupervisorSpec(Strategy.ONE_FOR_ALL),
    )
    await run_for(tree, 10)
    assert len(starts_of(journal, "a")) == 2
    assert len(starts_of(journal, "t")) == 1


async def test_backoff_doubles_between_restarts_up_to_the_cap(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec("x", recorder(journal, "x", lambda n: "crash" if n < 4 else None))],
        SupervisorSpec(max_restarts=10, period_s=100, backoff_base_s=0.5, backoff_cap_s=1.5),
    )
    await run_for(tree, 20)
    starts = starts_of(journal, "x")
    # Each run lasts 1 s before crashing; the gaps beyond that are the backoff.
    gaps = [round(b - a - 1.0, 6) for a, b in itertools.pairwise(starts)]
    assert gaps == [0.5, 1.0, 1.5, 1.5]


async def test_exceeding_intensity_stops_children_and_escalates_to_the_parent(
    autojump_clock: Any,
) -> None:
    journal: Journal = []
    inner = supervisor(
        "inner",
        [
            ChildSpec("steady", recorder(journal, "steady")),
            ChildSpec("flaky", recorder(journal, "flaky", lambda n: "crash")),
        ],
        SupervisorSpec(max_restarts=2, period_s=60, backoff_base_s=0.1),
    )
    outer = supervisor("outer", [inner], SupervisorSpec(max_restarts=1, period_s=600))
    with structlog.testing.capture_logs() as logs, pytest.raises(RestartIntensityExceeded) as info:
        await outer.run(root_ctx(), task_status=trio.TASK_STATUS_IGNORED)
    assert info.value.path == "node"
    gave_up = [e for e in logs if e["event"] == "actor_gave_up"]
    # inner gives up twice (once per outer start), then outer gives up on inner
    assert [e["child"] for e in gave_up] == ["flaky", "flaky", "inner"]
    # inner's first run: flaky started 3 times (2 restarts allowed), steady once
    assert len(starts_of(journal, "steady")) == 2
    assert len(starts_of(journal, "flaky")) == 6
    # every child was stopped before the give-up propagated
    assert len([e for e in events(journal) if e == ("stop", "steady")]) == 2


async def test_failed_start_counts_as_a_crash_and_is_retried(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [
            ChildSpec(
                "db", recorder(journal, "db", lambda n: "crash_before_ready" if n < 2 else None)
            ),
            ChildSpec("app", recorder(journal, "app")),
        ],
        SupervisorSpec(Strategy.REST_FOR_ONE),
    )
    await run_for(tree, 10)
    assert events(journal)[:4] == [
        ("start_failed", "db"),
        ("start_failed", "db"),
        ("start", "db"),
        ("start", "app"),  # not started before the child it depends on was up
    ]


async def test_children_stop_in_reverse_start_order(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor("sup", [ChildSpec(n, recorder(journal, n)) for n in "abc"])
    await run_for(tree, 5)
    assert [who for kind, who, _ in journal if kind == "stop"] == ["c", "b", "a"]


async def test_nested_supervisors_stop_depth_first_in_reverse(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "node",
        [
            ChildSpec("redis", recorder(journal, "redis")),
            supervisor("workers", [ChildSpec(n, recorder(journal, n)) for n in ("w1", "w2")]),
        ],
    )
    await run_for(tree, 5)
    assert [who for kind, who, _ in journal if kind == "stop"] == ["w2", "w1", "redis"]


async def test_crash_log_carries_the_traceback_and_actor_path(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor("sup", [ChildSpec("x", recorder(journal, "x", crash_first))])
    with structlog.testing.capture_logs() as logs:
        await run_for(tree, 5)
    crashed = [e for e in logs if e["event"] == "actor_crashed"]
    assert len(crashed) == 1
    assert isinstance(crashed[0]["exc_info"], RuntimeError)
    restarted = [e for e in logs if e["event"] == "actor_restarted"]
    assert restarted == [
        {
            "event": "actor_restarted",
            "actor": "node/x",
            "log_level": "info",
            "attempt": 1,
            "backoff_s": 0.1,
        }
    ]


# -- cancellation and cleanup ---------------------------------------------------------------


def cleaning_actor(journal: Journal, cleanup_s: float) -> Any:
    async def run(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with ctx.cleanup():
                journal.append(("cleanup_begin", ctx.name, trio.current_time()))
                await trio.sleep(cleanup_s)  # would raise Cancelled at once without the shield
                journal.append(("cleanup_end", ctx.name, trio.current_time()))

    return run


async def test_cancellation_runs_cleanup_under_a_shield(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor("sup", [ChildSpec("x", cleaning_actor(journal, 1.0), shutdown_s=3)])
    await run_for(tree, 5)
    assert [(k, round(t, 6)) for k, _, t in journal] == [("cleanup_begin", 5), ("cleanup_end", 6)]


async def test_cleanup_is_bounded_by_the_grace(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor("sup", [ChildSpec("x", cleaning_actor(journal, 100.0), shutdown_s=2)])
    with structlog.testing.capture_logs() as logs:
        await run_for(tree, 5)
    assert [k for k, _, _ in journal] == ["cleanup_begin"]
    assert trio.current_time() == pytest.approx(7.0)
    assert any(e["event"] == "cleanup_timeout" for e in logs)


async def test_cancelling_the_whole_tree_still_runs_every_cleanup(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup", [ChildSpec(n, cleaning_actor(journal, 0.5), shutdown_s=1) for n in ("a", "b")]
    )
    with trio.move_on_after(3):
        await tree.run(root_ctx(), task_status=trio.TASK_STATUS_IGNORED)
    assert sorted(who for kind, who, _ in journal if kind == "cleanup_end") == ["a", "b"]


def graceful_worker(journal: Journal, work_s: float) -> Any:
    async def run(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        try:
            await ctx.wait_stop_requested()
            journal.append(("stop_requested", ctx.name, trio.current_time()))
            await trio.sleep(work_s)  # finishing the work in hand
            journal.append(("finished", ctx.name, trio.current_time()))
        finally:
            journal.append(("exit", ctx.name, trio.current_time()))

    return run


async def test_graceful_child_finishes_within_its_grace(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor("sup", [ChildSpec("w", graceful_worker(journal, 2), graceful=True)])
    await run_for(tree, 5)
    assert events(journal) == [("stop_requested", "w"), ("finished", "w"), ("exit", "w")]


async def test_graceful_child_is_cancelled_when_its_grace_runs_out(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup", [ChildSpec("w", graceful_worker(journal, 60), graceful=True, shutdown_s=3)]
    )
    await run_for(tree, 5)
    assert events(journal) == [("stop_requested", "w"), ("exit", "w")]
    assert journal[-1][2] == pytest.approx(8.0)


async def test_stop_request_during_backoff_is_prompt(autojump_clock: Any) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec("x", recorder(journal, "x", lambda n: "crash"))],
        SupervisorSpec(max_restarts=100, period_s=1, backoff_base_s=1000, backoff_cap_s=1000),
    )
    await run_for(tree, 5)  # crashed at t=1, then waits 1000 s of backoff
    assert trio.current_time() == pytest.approx(5.0)
    assert len(starts_of(journal, "x")) == 1


def test_duplicate_child_names_are_refused() -> None:
    async def noop(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()

    with pytest.raises(ValueError, match="unique"):
        supervisor("sup", [ChildSpec("a", noop), ChildSpec("a", noop)])


# -- the pure parts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "now", "expected"),
    [
        ((), 0.0, ((0.0,), False)),
        ((0.0, 1.0, 2.0), 3.0, ((0.0, 1.0, 2.0, 3.0), True)),
        ((0.0, 1.0, 2.0), 5.5, ((1.0, 2.0, 5.5), False)),  # 0.0 left the 5 s window
        ((0.0,), 5.0, ((5.0,), False)),  # the window is half-open
    ],
)
def test_restart_window(
    history: tuple[float, ...], now: float, expected: tuple[tuple[float, ...], bool]
) -> None:
    assert record_restart(history, now, 3, 5.0) == expected


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff_s(n, 0.25, 1.0) for n in range(5)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    assert backoff_s(5000, 0.25, math.inf) > 1e17  # no overflow on long crash loops


def test_mock_clock_is_in_use(autojump_clock: trio.testing.MockClock) -> None:
    assert autojump_clock.autojump_threshold == 0


async def test_health_shows_a_crashed_child_down_until_its_restart(autojump_clock: Any) -> None:
    journal: Journal = []
    children = [
        ChildSpec("a", recorder(journal, "a")),
        ChildSpec("b", recorder(journal, "b", crash_first)),
        ChildSpec("t", recorder(journal, "t", lambda n: "exit"), restart=Restart.TEMPORARY),
    ]
    tree = supervisor("sup", children, SupervisorSpec(Strategy.ONE_FOR_ONE, backoff_base_s=5.0))
    ctx = root_ctx()
    seen: dict[int, tuple[dict[str, str], list[str]]] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(tree.run, ctx)
        for second in range(8):
            seen[second] = (ctx.health.down(), ctx.health.up())
            await trio.sleep(1)
        ctx.stop_requested.value = True
    # b crashes at t=1 and is down through its 5 s backoff; t, temporary, ended on purpose
    # at t=1 and is forgotten, not "down".
    assert seen[0] == ({}, ["node/a", "node/b", "node/t"])
    assert seen[2][0] == {"node/b": "crashed"} and "node/b" not in seen[2][1]
    assert seen[7] == ({}, ["node/a", "node/b"])
    # A stopping node is not ready: stopped children are down.
    assert ctx.health.down() == {"node/a": "stopped", "node/b": "stopped"}


async def test_a_slow_crash_loop_is_logged_every_attempt_and_escalates(
    autojump_clock: Any,
) -> None:
    """A child failing its start every 4 s never fills a 3-in-5-s intensity window; every
    attempt is still a line, and past max_attempts the supervisor gives up."""
    journal: Journal = []
    tree = supervisor(
        "sup",
        [ChildSpec("broken", recorder(journal, "broken", lambda n: "crash_before_ready"))],
        SupervisorSpec(
            max_restarts=3, period_s=5, backoff_base_s=4, backoff_cap_s=4, max_attempts=5
        ),
    )
    with structlog.testing.capture_logs() as logs, pytest.raises(RestartAttemptsExceeded) as info:
        await tree.run(root_ctx(), task_status=trio.TASK_STATUS_IGNORED)
    assert "broken failed 5 restarts in a row" in str(info.value)
    restarting = [e for e in logs if e["event"] == "actor_restarting"]
    assert [e["attempt"] for e in restarting] == [1, 2, 3, 4, 5]
    assert all(e["max_attempts"] == 5 and e["actor"] == "node/broken" for e in restarting)
    assert [e["event"] for e in logs if e["event"] == "actor_gave_up"] == ["actor_gave_up"]
    assert len([e for e in events(journal) if e == ("start_failed", "broken")]) == 6


async def test_a_start_that_fails_slowly_counts_on_and_gives_up(autojump_clock: Any) -> None:
    """A child whose start fails after 15 s (a server that never answers), longer than the
    5 s period: not healthy, it never came up; the attempts count on to max_attempts."""

    async def never_ready(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        await trio.sleep(15)
        raise RuntimeError("no answer in 15 s")

    tree = supervisor(
        "sup", [ChildSpec("slow", never_ready)],
        SupervisorSpec(period_s=5, backoff_base_s=1, backoff_cap_s=1, max_attempts=3),
    )  # fmt: skip
    with pytest.raises(RestartAttemptsExceeded):
        await tree.run(root_ctx(), task_status=trio.TASK_STATUS_IGNORED)


async def test_a_supervisor_below_that_gave_up_counts_on_at_its_parent(
    autojump_clock: Any,
) -> None:
    """A leaf up 2 s then crashing, under a supervisor that gives up after 3 attempts (it
    ran longer than its parent's 5 s period by then): each give-up counts on at the parent,
    which gives up in turn, so the node stops (exit 1) instead of restarting the subtree
    for ever."""
    journal: Journal = []

    async def brief(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        journal.append(("start", "brief", trio.current_time()))
        task_status.started()
        await trio.sleep(2)
        raise RuntimeError("up 2 s")

    fast = SupervisorSpec(period_s=5, backoff_base_s=1, backoff_cap_s=1, max_attempts=3)
    inner = supervisor("inner", [ChildSpec("brief", brief)], fast)
    outer = supervisor("outer", [inner], fast)
    with pytest.raises(RestartAttemptsExceeded) as info:
        await outer.run(root_ctx(), task_status=trio.TASK_STATUS_IGNORED)
    assert "inner failed 3 restarts in a row" in str(info.value)
    assert len(starts_of(journal, "brief")) == 4 * 4  # four subtrees of four starts each


async def test_a_child_that_stays_up_a_period_between_crashes_is_restarted_for_ever(
    autojump_clock: Any,
) -> None:
    """Crashing once a minute is not a crash loop: the count starts again each time."""
    journal: Journal = []

    async def minutely(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        journal.append(("start", "minutely", trio.current_time()))
        task_status.started()
        await trio.sleep(60)
        raise RuntimeError("once a minute")

    tree = supervisor(
        "sup", [ChildSpec("minutely", minutely)], SupervisorSpec(period_s=5, max_attempts=2)
    )
    with structlog.testing.capture_logs() as logs:
        await run_for(tree, 60 * 10 + 30)
    assert len(starts_of(journal, "minutely")) == 11
    assert {e["attempt"] for e in logs if e["event"] == "actor_restarting"} == {1}


async def test_a_supervisor_below_that_gave_up_after_hours_up_is_a_fresh_count(
    autojump_clock: Any,
) -> None:
    """A subtree that runs for hours, then crash-loops and gives up, once in a long while
    (no crash loop's backoffs take an hour): each give-up starts its parent's count again,
    so months of rare give-ups never add up to the parent giving up."""
    journal: Journal = []

    async def rare(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        journal.append(("start", "rare", trio.current_time()))
        task_status.started()
        if len(starts_of(journal, "rare")) % 3 == 1:
            await trio.sleep(2 * 3600)  # hours up, then a crash loop of three
        raise RuntimeError("down")

    fast = SupervisorSpec(period_s=5, backoff_base_s=1, backoff_cap_s=1, max_attempts=2)
    inner = supervisor("inner", [ChildSpec("rare", rare)], fast)
    outer = supervisor("outer", [inner], fast)
    with structlog.testing.capture_logs() as logs:
        await run_for(outer, 5 * 2 * 3600 + 60)
    assert len(starts_of(journal, "rare")) >= 5 * 3
    attempts = [(e["actor"], e["attempt"]) for e in logs if e["event"] == "actor_restarting"]
    assert {a for actor, a in attempts if actor.endswith("/inner")} == {1}, attempts


async def test_a_supervisor_has_started_only_once_its_children_have(autojump_clock: Any) -> None:
    """OTP: a child whose start fails is restarted before its supervisor reports ready, so
    a sibling started after that supervisor never runs before it is whole."""
    journal: Journal = []
    inner = supervisor(
        "inner",
        [
            ChildSpec(
                "db", recorder(journal, "db", lambda n: "crash_before_ready" if n < 2 else None)
            )
        ],
    )
    outer = supervisor("outer", [inner, ChildSpec("app", recorder(journal, "app"))])
    await run_for(outer, 10)
    assert events(journal)[:4] == [
        ("start_failed", "db"),
        ("start_failed", "db"),
        ("start", "db"),
        ("start", "app"),
    ]


async def test_a_temporary_child_failing_its_start_does_not_hold_up_the_rest(
    autojump_clock: Any,
) -> None:
    journal: Journal = []
    tree = supervisor(
        "sup",
        [
            ChildSpec(
                "once", recorder(journal, "once", lambda n: "crash_before_ready"),
                restart=Restart.TEMPORARY,
            ),
            ChildSpec("after", recorder(journal, "after")),
        ],
    )  # fmt: skip
    await run_for(tree, 5)
    assert events(journal)[:2] == [("start_failed", "once"), ("start", "after")]


async def test_children_are_down_until_started_and_a_dropped_subtree_is_forgotten(
    autojump_clock: Any,
) -> None:
    """/readyz waits for every actor: one not started yet (its earlier sibling still
    starting) is down, ``starting``. A temporary supervisor whose start gave up is dropped
    with every mark under it (its children's ``starting`` and ``crashed`` kept /readyz at
    503 for good)."""
    journal: Journal = []

    async def slow(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        await trio.sleep(3)
        task_status.started()
        await trio.sleep_forever()

    doomed = supervisor(
        "doomed",
        [ChildSpec("bad", recorder(journal, "bad", lambda n: "crash_before_ready")),
         ChildSpec("after", recorder(journal, "after"))],
        SupervisorSpec(max_attempts=1, backoff_base_s=0.01),
        restart=Restart.TEMPORARY,
    )  # fmt: skip
    tree = supervisor("sup", [ChildSpec("slow", slow), doomed, ChildSpec("last", slow)])
    ctx = root_ctx()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: tree.run(ctx, task_status=trio.TASK_STATUS_IGNORED))
        await trio.sleep(1)
        assert ctx.health.down() == {
            "node/slow": "starting", "node/doomed": "starting", "node/last": "starting"
        }  # fmt: skip
        await trio.sleep(10)
        assert ctx.health.down() == {}, ctx.health.down()
        assert ctx.health.up() == ["node/last", "node/slow"]
        ctx.stop_requested.value = True
