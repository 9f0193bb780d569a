"""What an actor is: a long-lived trio task with a name, a place in the tree and a lifecycle.

An actor is an async function ``run(ctx, task_status=...)``:

1. it prepares what it needs (a consumer group, a bound port) and only then calls
   ``task_status.started()``: its supervisor starts the next sibling after that;
2. it loops until it is cancelled, or, if its child spec says ``graceful=True``, until
   ``ctx.stop_requested`` becomes true, which is how a supervisor asks it to finish its
   work in hand before the grace runs out;
3. it releases what it holds in ``with ctx.cleanup():`` inside a ``finally:``: the body is
   shielded from cancellation but bounded by the child's grace, so cleanup always runs and
   never hangs a shutdown.

Stopping an actor is cancelling its scope, never an ad-hoc flag; the stop request is only a
courtesy to actors that can finish their work gracefully.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import attrs
import structlog
import trio
import trio_util

from runtime.health import Health

TaskStatus = trio.TaskStatus[Any]
"""What ``nursery.start`` hands an actor: call ``started()`` once ready."""


class ActorFn(Protocol):
    """The signature every actor (and every supervisor) has."""

    def __call__(self, ctx: ActorContext, *, task_status: TaskStatus) -> Awaitable[None]: ...


@attrs.define
class ActorContext:
    """What a running actor knows about itself. One per (re)start; owned by the supervisor."""

    path: str
    """Place in the supervision tree, e.g. ``node/consumers/email``."""
    cleanup_grace_s: float
    """How long ``cleanup()`` may take before it is cancelled."""
    log: structlog.typing.FilteringBoundLogger
    """A logger bound to ``actor=path``."""
    stop_requested: trio_util.AsyncBool = attrs.field(factory=lambda: trio_util.AsyncBool(False))
    """Set by the supervisor to ask a graceful actor to wind down (see module docstring)."""
    health: Health = attrs.field(factory=Health)
    """The node's record of which actors run (shared by the whole tree; ``/readyz``)."""
    node_stopping: trio_util.AsyncBool = attrs.field(factory=lambda: trio_util.AsyncBool(False))
    """Set once for the whole tree when the node itself begins to stop (shared like
    ``health``). Supervisors stop children one by one, in reverse order; an actor whose
    wind-down is slow and independent of its siblings (a child process draining its
    handlers) may start it on this instead of waiting for its turn."""

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def child(self, name: str, cleanup_grace_s: float) -> ActorContext:
        """The context of a child of this actor in the tree."""
        path = f"{self.path}/{name}"
        return ActorContext(
            path,
            cleanup_grace_s,
            self.log.bind(actor=path),
            health=self.health,
            node_stopping=self.node_stopping,
        )

    @contextmanager
    def cleanup(self) -> Iterator[trio.CancelScope]:
        """Shield a cleanup block from cancellation, bounded by ``cleanup_grace_s``."""
        with trio.move_on_after(self.cleanup_grace_s, shield=True) as scope:
            yield scope
        if scope.cancelled_caught:
            self.log.warning("cleanup_timeout", grace_s=self.cleanup_grace_s)

    async def wait_stop_requested(self) -> None:
        await self.stop_requested.wait_value(True)


def actor(fn: Callable[[ActorContext], Awaitable[None]]) -> ActorFn:
    """Adapt a plain ``async def fn(ctx)`` that is ready as soon as it starts into an actor."""

    async def run(ctx: ActorContext, *, task_status: TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await fn(ctx)

    run.__name__ = getattr(fn, "__name__", "actor")
    return run
