"""Run one node: a root supervisor, signal handling, and the exit status.

Shutdown order: the first SIGINT/SIGTERM asks the root supervisor to stop, which stops its
children in reverse start order, each within its own grace; if the whole node is not down
within ``shutdown_grace_s`` everything left is cancelled (cleanups still run, shielded and
bounded). A second signal cancels at once.
"""

from __future__ import annotations

import signal

import trio

from runtime.actor import ActorContext
from runtime.errors import RestartIntensityExceeded
from runtime.logging import get_logger
from runtime.supervisor import ChildSpec

EXIT_OK = 0
EXIT_GAVE_UP = 1
EXIT_CONFIG = 2


async def run_node(root: ChildSpec, *, shutdown_grace_s: float) -> int:
    """Run the tree under ``root`` until a signal stops it or it gives up; return the exit code."""
    log = get_logger(actor=root.name)
    ctx = ActorContext(root.name, shutdown_grace_s, log)
    finished = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_handle_signals, ctx, nursery.cancel_scope, shutdown_grace_s)
        try:
            await root.run(ctx, task_status=trio.TASK_STATUS_IGNORED)
            finished = True
        except RestartIntensityExceeded as exc:
            log.critical("node_gave_up", error=str(exc))
            return EXIT_GAVE_UP
        finally:
            nursery.cancel_scope.cancel()  # ends _handle_signals
    if not finished:
        log.warning("shutdown_forced", grace_s=shutdown_grace_s)
    log.info("node_stopped")
    return EXIT_OK


async def _handle_signals(ctx: ActorContext, scope: trio.CancelScope, grace_s: float) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not ctx.stop_requested.value:
                ctx.log.info("shutdown_requested", signal=name, grace_s=grace_s)
                ctx.stop_requested.value = True
                # Hard stop once the grace is over, whatever is still running.
                scope.deadline = min(scope.deadline, trio.current_time() + grace_s)
            else:
                ctx.log.warning("shutdown_immediate", signal=name)
                scope.cancel()
