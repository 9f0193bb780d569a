"""Run one node: a root supervisor, signal handling, and the exit status.

Shutdown order: the first SIGINT/SIGTERM/SIGHUP asks the root supervisor to stop, which stops its
children in reverse start order, each within its own grace; if the whole node is not down
within ``shutdown_grace_s`` everything left is cancelled (cleanups still run, shielded and
bounded). A second signal cancels at once; later ones wait for those cleanups too.

A node's child process (``--part``, see ``runtime.process``) follows its parent instead:
SIGTERM (any number of them) or the end of its stdin (the parent is gone) stops it
gracefully, SIGINT and SIGHUP are ignored, and an immediate stop is the parent's SIGKILL. Its stdin
also carries the parent's health reports (what is down in the main process).
"""

from __future__ import annotations

import json
import os
import signal

import trio

from runtime.actor import ActorContext
from runtime.errors import GiveUpNow, RestartIntensityExceeded
from runtime.logging import get_logger
from runtime.process import EXIT_PART_GAVE_UP, lines_of, send_changes
from runtime.supervisor import ChildSpec
from runtime.version import __version__

EXIT_OK = 0
EXIT_GAVE_UP = 1
EXIT_CONFIG = 2


async def run_node(
    root: ChildSpec, *, shutdown_grace_s: float, child: bool = False, report_fd: int | None = None
) -> int:
    """Run the tree under ``root`` until a signal stops it or it gives up; return the exit code.

    ``child``: this process is a part of a node, started by it (module docstring), which
    reads its health reports from ``report_fd``.
    """
    log = get_logger(actor=root.name)
    ctx = ActorContext(root.name, shutdown_grace_s, log)
    log.info("node_started", version=__version__, pid=os.getpid())
    finished = False
    started = _Started(ctx)
    # The tree runs in a scope of its own: the signal handler outlives its cancellation
    # (the grace over, or a second signal), so more signals while the cleanups run
    # (shielded, each bounded by its own grace) find it there, not Python's default
    # handling, which killed the process mid-cleanup (its last flush cut off).
    tree = trio.CancelScope()
    async with trio.open_nursery() as helpers:
        if child:
            helpers.start_soon(_follow_parent, ctx, tree, shutdown_grace_s)
            if report_fd is not None:
                helpers.start_soon(_report_to_parent, ctx, report_fd, started)
        else:
            helpers.start_soon(_handle_signals, ctx, tree, shutdown_grace_s)
        try:
            with tree:
                await root.run(ctx, task_status=started)
                finished = True
        except (RestartIntensityExceeded, GiveUpNow) as exc:
            log.critical("node_gave_up", error=str(exc))
            return EXIT_PART_GAVE_UP if child else EXIT_GAVE_UP
        finally:
            helpers.cancel_scope.cancel()  # ends the signal handler
    if not finished:
        log.warning("shutdown_forced", grace_s=shutdown_grace_s)
    log.info("node_stopped")
    return EXIT_OK


class _Started:
    """The root's task status: whether its tree has started (a child process tells its
    parent, ``_report_to_parent``)."""

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.done = False

    def started(self, value: object = None) -> None:
        self.done = True
        self.ctx.health.changes.value += 1  # a change to report


async def _report_to_parent(ctx: ActorContext, fd: int, started: _Started) -> None:
    """Tell the parent, one JSON line per change, whether this part's tree has started and
    what is down in it (``runtime.process._take_reports``). Written through a copy of
    ``fd`` that no process started here inherits; a parent gone ends the reports (its
    stdin's end stops this process)."""
    copy = os.dup(fd)  # not inheritable (PEP 446)
    os.close(fd)
    async with trio.lowlevel.FdStream(copy) as out:
        await send_changes(
            ctx, out, lambda: {"ready": started.done, "down": ctx.health.down(local_only=True)}
        )


def _request_stop(ctx: ActorContext, scope: trio.CancelScope, grace_s: float, **why: str) -> None:
    ctx.log.info("shutdown_requested", grace_s=grace_s, **why)
    ctx.stop_requested.value = True
    ctx.node_stopping.value = True
    # Hard stop once the grace is over, whatever is still running.
    scope.deadline = min(scope.deadline, trio.current_time() + grace_s)


def stop_signals() -> list[signal.Signals]:
    """What stops a node gracefully: SIGINT, SIGTERM, and SIGHUP (a terminal's hangup, an
    SSH session closed on a node started without nohup: its default action killed the
    node with no drain) unless the node was started with it ignored (``nohup``)."""
    hangup = [] if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else [signal.SIGHUP]
    return [signal.SIGINT, signal.SIGTERM, *hangup]


def ignore_the_groups_signals() -> None:
    """A child process's first step: SIGINT and SIGHUP, sent to the whole process group by
    a terminal, are its parent's to relay (as SIGTERM), also while it starts or ends.
    Caught and dropped rather than ignored: an ignored signal stays ignored in every
    program a handler starts (``exec`` resets only caught ones)."""
    signal.signal(signal.SIGINT, _dropped)
    signal.signal(signal.SIGHUP, _dropped)


def _dropped(_signum: int, _frame: object) -> None:
    """A signal a child process leaves to its parent."""


async def _handle_signals(ctx: ActorContext, scope: trio.CancelScope, grace_s: float) -> None:
    with trio.open_signal_receiver(*stop_signals()) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not ctx.stop_requested.value:
                _request_stop(ctx, scope, grace_s, signal=name)
            else:
                ctx.log.warning("shutdown_immediate", signal=name)
                scope.cancel()


async def _follow_parent(ctx: ActorContext, scope: trio.CancelScope, grace_s: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_parent, ctx, scope, grace_s)
        with trio.open_signal_receiver(signal.SIGTERM) as signals:  # the others ignored
            async for _ in signals:  # (ignore_the_groups_signals)
                if not ctx.stop_requested.value:
                    _request_stop(ctx, scope, grace_s, signal="SIGTERM")


async def _watch_parent(ctx: ActorContext, scope: trio.CancelScope, grace_s: float) -> None:
    """Take the parent's health reports from stdin, and stop when it ends: only the parent
    holds the pipe's other end. Read through a copy of fd 0 that no process started here
    inherits; fd 0 itself becomes /dev/null, so a handler's subprocess (which inherits
    stdin by default) neither reads the reports nor keeps the pipe open."""
    reports = os.dup(0)  # not inheritable (PEP 446)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    async with trio.lowlevel.FdStream(reports) as stdin:
        async for line in lines_of(stdin):
            _take_report(ctx, line)
    if not ctx.stop_requested.value:
        _request_stop(ctx, scope, grace_s, reason="parent_gone")


def _take_report(ctx: ActorContext, line: bytes) -> None:
    try:
        down = json.loads(line)["down"]
    except (ValueError, KeyError, TypeError):
        ctx.log.warning("parent_report_unreadable", line=line[:200].decode(errors="replace"))
        return
    if isinstance(down, dict):
        ctx.health.set_elsewhere({str(k): str(v) for k, v in down.items()})
