"""Supervisors in the OTP sense: start children in order, watch them, restart them by policy.

Vocabulary (verbatim from OTP's ``supervisor``):

- strategy ``one_for_one``: only the child that exited is restarted;
  ``one_for_all``: all children are stopped (reverse order) and restarted (in order);
  ``rest_for_one``: the children started after it are stopped (reverse) and it and they are
  restarted (in order) — the strategy for "later children depend on earlier ones".
- restart type ``permanent``: always restarted; ``transient``: restarted only after an
  abnormal exit (an exception); ``temporary``: never restarted, and dropped when a sibling's
  restart stops it.
- intensity: more than ``max_restarts`` restarts within ``period_s`` seconds and the
  supervisor stops all its children and raises ``RestartIntensityExceeded``: its parent
  decides. Between restarts it waits an exponential, capped backoff (``runtime.intensity``).
- shutdown: a child's ``shutdown_s`` is its grace. A ``graceful`` child is first asked to stop
  (``ctx.stop_requested``) and given that long to finish; then (or at once, for others) its
  scope is cancelled and its own cleanup runs shielded, again bounded by ``shutdown_s``.

A start that fails (the actor raises before ``task_status.started()``) counts as a crash of
that child: a Redis that is not up yet at boot is retried with backoff, not fatal.

Every start, crash (with traceback), restart, stop and give-up is one structured log line.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import attrs
import trio
import trio_util

from runtime.actor import ActorContext, ActorFn, TaskStatus
from runtime.errors import (
    ChildProcessGaveUp,
    GiveUpNow,
    RestartAttemptsExceeded,
    RestartIntensityExceeded,
)
from runtime.intensity import backoff_s, record_restart

#: How long a child whose own supervisor gave up must have run for that give-up to count
#: as a fresh failure, not one more of a crash loop (``_on_exit``).
GAVE_UP_FORGOTTEN_S = 3600.0


class Strategy(enum.Enum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class Restart(enum.Enum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


@attrs.frozen
class ChildSpec:
    """How to start one child and what to do when it exits."""

    name: str
    run: ActorFn
    restart: Restart = Restart.PERMANENT
    shutdown_s: float = 5.0
    """Grace: how long a graceful child may take to finish after a stop request, and how
    long any child's shielded cleanup may take after cancellation."""
    graceful: bool = False
    """Whether the child watches ``ctx.stop_requested`` to finish work in hand."""


@attrs.frozen
class SupervisorSpec:
    """A supervisor's policy. Defaults follow OTP (intensity 1 in 5 s is OTP's; we allow 3)."""

    strategy: Strategy = Strategy.ONE_FOR_ONE
    max_restarts: int = 3
    period_s: float = 5.0
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 5.0
    max_attempts: int | None = None
    """Consecutive restarts of one child that never stays up ``period_s``: past this many,
    the supervisor gives up even if the intensity window never fills (a child failing
    every few seconds, slower than ``max_restarts`` per ``period_s``). None: no bound."""


def supervisor(
    name: str,
    children: Sequence[ChildSpec],
    spec: SupervisorSpec | None = None,
    *,
    restart: Restart = Restart.PERMANENT,
) -> ChildSpec:
    """A child spec that runs a supervisor over ``children``; supervisors nest."""
    sup = Supervisor(list(children), spec or SupervisorSpec())
    # A supervisor stops by stopping its children, each bounded by its own grace: it needs
    # no grace of its own (OTP gives supervisors ``infinity``).
    return ChildSpec(name, sup.run, restart=restart, shutdown_s=math.inf, graceful=True)


@attrs.define(eq=False)
class _Running:
    """One started child. Owned by its supervisor."""

    spec: ChildSpec
    ctx: ActorContext
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    stopping: bool = False
    """Set when the supervisor stops the child on purpose: its exit is not a crash."""
    up: bool = False
    """Its start succeeded (``task_status.started()``)."""
    up_at: float | None = None
    """When its start succeeded."""


@attrs.frozen
class _Exit:
    child: _Running
    error: BaseException | None


@attrs.frozen
class _StartFailed:
    error: BaseException | None


_STOP = object()


class Supervisor:
    """Runs a list of child specs under one policy. Use through ``supervisor()``."""

    def __init__(self, children: list[ChildSpec], spec: SupervisorSpec) -> None:
        names = [c.name for c in children]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique, got {names}")
        self._initial = children
        self._policy = spec

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        # State for one run of this supervisor; a restart of the supervisor starts afresh.
        run = _SupervisorRun(ctx, list(self._initial), self._policy)
        await run.run(task_status)


class _SupervisorRun:
    def __init__(self, ctx: ActorContext, specs: list[ChildSpec], policy: SupervisorSpec) -> None:
        self._ctx = ctx
        self._log = ctx.log
        # Invariant: _specs is in start order; children leave it only when they must not be
        # restarted again (temporary, or transient after a normal exit).
        self._specs = specs
        self._policy = policy
        self._running: dict[str, _Running] = {}
        self._history: tuple[float, ...] = ()
        self._attempts: dict[str, int] = {}
        """Per child: restarts in a row without it staying up ``period_s``."""
        self._events_send, self._events = trio.open_memory_channel[Any](math.inf)
        self._nursery: trio.Nursery | None = None
        self._stopped = False

    async def run(self, task_status: TaskStatus) -> None:
        gave_up: RestartIntensityExceeded | GiveUpNow | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for spec in self._specs:  # down until started: /readyz waits for every child
                self._ctx.health.mark_down(f"{self._ctx.path}/{spec.name}", "starting")
            all_up = await self._ensure_started(restarting=None)
            nursery.start_soon(self._forward_stop_request)
            try:
                if not all_up:
                    # As in OTP, a supervisor has started only once its children have: a
                    # child whose start failed is restarted (with backoff, within the
                    # intensity and attempts) before this one reports ready; giving up
                    # here fails this supervisor's own start.
                    await self._supervise(until_all_up=True)
                task_status.started()
                if not self._stopped:
                    await self._supervise()
            except (RestartIntensityExceeded, GiveUpNow) as exc:
                gave_up = exc
            finally:
                # Whether we return (stop requested) or give up, children are gone by now;
                # this only ends _forward_stop_request.
                nursery.cancel_scope.cancel()
        if gave_up is not None:
            # Raised outside the nursery so the parent sees the error itself, not a group.
            raise gave_up

    async def _forward_stop_request(self) -> None:
        await self._ctx.wait_stop_requested()
        self._events_send.send_nowait(_STOP)

    async def _supervise(self, *, until_all_up: bool = False) -> None:
        async for event in self._events:
            if event is _STOP:
                await self._stop_all()
                self._stopped = True
                return
            await self._on_exit(event)
            if until_all_up:
                if self._children_up():
                    return
                if all(r.up for r in self._running.values()):
                    # The child that failed is not restarted (temporary): start the rest.
                    await self._ensure_started(restarting=None)
                    if self._children_up():
                        return

    # -- starting -------------------------------------------------------------------------

    async def _ensure_started(self, restarting: dict[str, Any] | None) -> bool:
        """Start, in spec order, every child that should run and does not; stop at the first
        start failure (its crash event is already queued and will be handled next). Whether
        every child is up."""
        for spec in list(self._specs):
            if spec.name in self._running:
                continue
            if not await self._start(spec, restarting):
                return False
        return True

    def _children_up(self) -> bool:
        """Every child that should run has started (a failed start is not up, even while
        its exit is still queued)."""
        return all(
            spec.name in self._running and self._running[spec.name].up for spec in self._specs
        )

    async def _start(self, spec: ChildSpec, restarting: dict[str, Any] | None) -> bool:
        assert self._nursery is not None
        running = _Running(spec, self._ctx.child(spec.name, spec.shutdown_s))
        self._running[spec.name] = running
        outcome = await self._nursery.start(self._child_main, running)
        if isinstance(outcome, _StartFailed):
            return False
        running.up, running.up_at = True, trio.current_time()
        running.ctx.health.mark_up(running.ctx.path)
        if restarting is not None:
            running.ctx.log.info("actor_restarted", **restarting)
        else:
            running.ctx.log.info("actor_started")
        return True

    async def _child_main(self, running: _Running, task_status: TaskStatus) -> None:
        started = False

        class _Status:
            def started(self, value: Any = None) -> None:
                nonlocal started
                started = True
                task_status.started(value)

        error: BaseException | None = None
        try:
            with running.scope:
                await running.spec.run(running.ctx, task_status=_Status())
        except Exception as exc:
            error = exc
        finally:
            running.done.set()
        if not started:
            task_status.started(_StartFailed(error))
        self._events_send.send_nowait(_Exit(running, error))

    # -- exits and restarts ---------------------------------------------------------------

    async def _on_exit(self, event: _Exit) -> None:
        child = event.child
        if self._running.get(child.spec.name) is not child or child.stopping:
            return  # stopped on purpose, or a stale event from an earlier generation
        del self._running[child.spec.name]
        abnormal = event.error is not None
        if abnormal:
            child.ctx.log.error("actor_crashed", exc_info=event.error)
        else:
            child.ctx.log.info("actor_exited")
        restart = child.spec.restart is Restart.PERMANENT or (
            child.spec.restart is Restart.TRANSIENT and abnormal
        )
        if isinstance(event.error, GiveUpNow):  # no restart mends it: up, at once
            self._log.error("actor_gave_up", child=child.spec.name, error=str(event.error))
            await self._stop_all()
            raise event.error
        if not restart:
            self._specs.remove(child.spec)
            child.ctx.health.forget(child.ctx.path)
            return
        child.ctx.health.mark_down(child.ctx.path, "crashed" if abnormal else "exited")
        now = trio.current_time()
        self._history, exceeded = record_restart(
            self._history, now, self._policy.max_restarts, self._policy.period_s
        )
        # Up a whole period before it failed: not a crash loop, the count starts again. A
        # start that failed, however long it took (a server that never answered), and a
        # supervisor below that gave up (its children crash-looped), count on: else a
        # slow crash loop under a supervisor that outlives the period never gave up;
        # unless that supervisor had run ``GAVE_UP_FORGOTTEN_S`` first (no crash loop's
        # backoffs take as long: it gave up once in a long while, a fresh count).
        gave_up = isinstance(
            event.error, (RestartIntensityExceeded, RestartAttemptsExceeded, ChildProcessGaveUp)
        )
        up_s = None if child.up_at is None else now - child.up_at
        healthy = up_s is not None and (
            up_s >= GAVE_UP_FORGOTTEN_S if gave_up else up_s >= self._policy.period_s
        )
        attempts = 1 if healthy else self._attempts.get(child.spec.name, 0) + 1
        self._attempts[child.spec.name] = attempts
        limit = self._policy.max_attempts
        if limit is not None and attempts > limit:
            self._log.error(
                "actor_gave_up", child=child.spec.name, attempts=attempts - 1, max_attempts=limit
            )
            await self._stop_all()
            raise RestartAttemptsExceeded(
                self._ctx.path, child.spec.name, attempts - 1, self._policy.period_s
            ) from event.error
        if exceeded:
            self._log.error(
                "actor_gave_up",
                child=child.spec.name,
                max_restarts=self._policy.max_restarts,
                period_s=self._policy.period_s,
            )
            await self._stop_all()
            raise RestartIntensityExceeded(
                self._ctx.path, self._policy.max_restarts, self._policy.period_s
            ) from event.error
        await self._stop_for_strategy(child.spec)
        attempt = len(self._history)
        delay = backoff_s(
            max(attempt, attempts), self._policy.backoff_base_s, self._policy.backoff_cap_s
        )
        # Every attempt is a line, also one whose start then fails: a slow crash loop shows.
        child.ctx.health.note_restart(child.ctx.path)
        child.ctx.log.warning(
            "actor_restarting", attempt=attempts, backoff_s=delay, max_attempts=limit
        )
        # A stop request during the backoff ends the wait: _supervise sees _STOP next.
        async with trio_util.move_on_when(self._ctx.wait_stop_requested):
            await trio.sleep(delay)
            await self._ensure_started({"attempt": attempts, "backoff_s": delay})

    async def _stop_for_strategy(self, failed: ChildSpec) -> None:
        if self._policy.strategy is Strategy.ONE_FOR_ONE:
            return
        if self._policy.strategy is Strategy.ONE_FOR_ALL:
            victims = list(self._specs)
        else:
            victims = self._specs[self._specs.index(failed) + 1 :]
        for spec in reversed(victims):
            if spec.name in self._running:
                await self._stop(self._running[spec.name])
            if spec.restart is Restart.TEMPORARY:
                self._specs.remove(spec)
                self._ctx.health.forget(f"{self._ctx.path}/{spec.name}")

    # -- stopping -------------------------------------------------------------------------

    async def _stop_all(self) -> None:
        """Stop running children in reverse start order: later children may depend on
        earlier ones (a consumer on the embedded Redis), never the other way round."""
        for spec in reversed(self._specs):
            if spec.name in self._running:
                await self._stop(self._running[spec.name])
        for name in list(self._running):  # children already dropped from _specs
            await self._stop(self._running[name])

    async def _stop(self, child: _Running) -> None:
        child.stopping = True
        child.ctx.health.mark_down(child.ctx.path, "stopped")
        if child.spec.graceful:
            child.ctx.stop_requested.value = True
            with trio.move_on_after(child.spec.shutdown_s):
                await child.done.wait()
        child.scope.cancel()
        await child.done.wait()
        del self._running[child.spec.name]
        child.ctx.log.info("actor_stopped")
