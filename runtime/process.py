"""Child processes: one node, several OS processes, one supervision tree.

A Python process runs on one core at a time (the GIL), so a node that must use more than
one core runs parts of its tree in child processes: ``python -m runtime node.toml --part
NAME`` runs only the part ``NAME`` of the same config. In the parent, each child process
is an ordinary actor (``ChildProcess``) under an ordinary supervisor: a child that dies is
restarted with the supervisor's backoff and intensity, like any actor that crashed.

The contract between the two, all of it here:

- **Stopping.** The parent sends SIGTERM when it stops the child, or as soon as the whole
  node begins to stop (``ctx.node_stopping``), so every child drains at once rather than
  one after the other. The child stops gracefully within its grace (the node's, less a
  margin, so that it is done before the parent's own grace runs out); past the parent's
  grace the child is killed (SIGKILL). In a child, SIGINT is ignored (a terminal's Ctrl-C
  reaches the whole process group; the parent relays it) and repeated SIGTERMs are one
  request (systemd signals every process of the unit), so only the parent decides when a
  stop becomes immediate.
- **Orphans.** The child's stdin is a pipe whose other end only the parent holds. If the
  parent dies, even by SIGKILL, the kernel closes it, the child reads end-of-file and
  stops gracefully: a child never outlives its node for long. The child reads it through
  a copy no process it starts inherits (its fd 0 becomes /dev/null), so a handler's
  subprocess neither takes the parent's lines nor holds the pipe open.
- **Output.** Where the parent's stdout is a regular file opened for appending (``>>``),
  the child inherits it and writes its lines there itself, each batch in one write, which
  a local filesystem appends whole (``runtime.logging.output_is_a_file``); it goes on
  writing its last lines if the parent is killed. Anything else (a file without
  ``O_APPEND``, a pipe, journald's socket, a terminal: whole only up to 4 KiB) gets the
  child's stdout through a pipe to the parent, which relays it to its own in whole lines:
  one writer, so lines of different processes never interleave however large a batch.
  Once such a parent is gone, the child drops its lines (``runtime.logging.Lenient``).
  Either way its lines name the part in ``node`` (``host-1/consumers-1``). Stderr is
  inherited.
- **Health.** The parent writes to the child's stdin, one JSON line per change, what is
  down in the node but in that child (``{"down": {path: reason}}``: the main process's
  actors, each child process as one actor, and what the other children reported), so a
  child serving the API reports on the whole node in ``/readyz``. The child writes back,
  on a pipe of its own (``--report-fd``), one line per change: whether its tree has
  started and what is down in it (``{"ready": bool, "down": {...}}``). Until its tree
  has started (``<path>/(starting)``) and while an actor in it is down (under the child
  process's path: ``node/processes/consumers-1/consumers/email``), the node is not ready:
  a consumer process still importing its handlers, or restarted after a kill, is no
  consumer yet.
- **Exit.** Status 0 after a stop the parent asked for is a normal stop; 0 otherwise (the
  child was stopped by someone else) is a normal exit, restarted if permanent; anything
  else is a crash, except death by our SIGTERM while it was still starting up. Status
  ``EXIT_PART_GAVE_UP`` says the child's own tree gave up (its actors crash-looped): a
  crash that never counts as the child having stayed up, so a part that keeps giving up
  makes its parent's supervisor give up in turn, and the node exits 1, however slowly
  each give-up came (a child's backoffs outlast its parent's period). Status
  ``EXIT_PART_CONFIG`` says the child refused its node's config (the file changed on disk
  since the node started): every supervisor gives up at once (``GiveUpNow``), the node
  exits 1 to be started again whole on the new file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio_util

from runtime.actor import ActorContext, TaskStatus
from runtime.errors import ChildProcessFailed, ChildProcessGaveUp, GiveUpNow
from runtime.logging import output_is_a_file, write_lines

#: How much sooner than its parent a child must be done stopping: at most 1 s, or a tenth
#: of the grace when that is shorter.
GRACE_MARGIN_S = 1.0


#: The name under which a child process whose tree has not started yet is down.
STARTING = "(starting)"
#: After a child exits, how long its output may take to reach end-of-file.
RELAY_DRAIN_S = 1.0
#: A child's exit status when it refuses its node's config: the file changed on disk
#: since the node started (or no longer reads). No restart mends that. One no Python
#: error, usage or config error of a command line uses: a handler's ``os._exit(2)`` is a
#: crash like any other.
EXIT_PART_CONFIG = 89
#: A child's exit status when its own tree gave up: one no Python error (1), usage or
#: config error (2) or common convention uses, so a handler's ``sys.exit(3)`` is no
#: give-up.
EXIT_PART_GAVE_UP = 88


def child_grace_s(grace_s: float) -> float:
    """The grace a child process gets when its node has ``grace_s``."""
    return grace_s - min(GRACE_MARGIN_S, grace_s / 10)


def part_argv(config_path: Path, part: str, config_digest: str = "") -> list[str]:
    """The command that runs part ``part`` of the node configured by ``config_path``, which
    refuses the file if its digest is no longer ``config_digest`` (when given)."""
    argv = [sys.executable, "-m", "runtime", str(config_path.resolve()), "--part", part]
    return argv + (["--config-digest", config_digest] if config_digest else [])


class ChildProcess:
    """An actor that runs one part of the node as a child process (see module docstring)."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        # A log file opened for appending is shared (each batch of lines one write:
        # output_is_a_file); any other output gets the child's lines through a pipe,
        # relayed in whole lines.
        direct = output_is_a_file()
        reports, report_end = os.pipe()  # the child's, written at the other end
        try:
            process = await trio.lowlevel.open_process(
                [*self.argv, "--report-fd", str(report_end)], stdin=subprocess.PIPE,
                stdout=None if direct else subprocess.PIPE, pass_fds=(report_end,),
            )  # fmt: skip
        except BaseException:
            os.close(reports)
            raise
        finally:
            os.close(report_end)
        ctx.log.info("process_started", pid=process.pid)
        ctx.health.report(ctx.path, {f"{ctx.path}/{STARTING}": "starting"})
        exited = {f"{ctx.path}/(exited)": "exited"}  # from its exit to its next start
        stop_asked = False
        relayed = trio.Event()
        try:
            task_status.started()
            async with trio.open_nursery() as nursery:
                if process.stdout is None:
                    relayed.set()
                else:
                    nursery.start_soon(_relay_lines, process.stdout, relayed)
                nursery.start_soon(_take_reports, ctx, reports, lambda: process.returncode)

                async def relay_stop() -> None:
                    nonlocal stop_asked
                    await trio_util.wait_any(
                        ctx.wait_stop_requested, partial(ctx.node_stopping.wait_value, True)
                    )
                    stop_asked = True
                    process.send_signal(signal.SIGTERM)

                nursery.start_soon(relay_stop)
                assert process.stdin is not None
                nursery.start_soon(_report_health, ctx, process.stdin)
                await process.wait()
                # Not ready from here until its next start: its last report said what was
                # up in it, and its supervisor may take a while to see the exit (it waits
                # out another child's backoff).
                ctx.health.report(ctx.path, exited)
                # Its last lines; bounded, in case a process it started holds the pipe.
                with trio.move_on_after(RELAY_DRAIN_S):
                    await relayed.wait()
                nursery.cancel_scope.cancel()
        finally:
            ctx.health.report(ctx.path, exited)  # replaced at its next start
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
                ctx.log.warning("process_killed", pid=process.pid)
            with trio.CancelScope(shield=True):  # each restart would leak its pipes
                if process.stdin is not None:
                    await process.stdin.aclose()
                if process.stdout is not None:
                    await process.stdout.aclose()
        status = process.returncode
        if status == 0 or (stop_asked and status == -signal.SIGTERM):
            # -SIGTERM: stopped before it had set up its own handling (still starting).
            ctx.log.info("process_exited", pid=process.pid, asked=stop_asked)
            if ctx.node_stopping.value:
                # Drained with the node, before its supervisor's turn to stop it: wait
                # for that turn (returning now would read as an exit to restart).
                await ctx.wait_stop_requested()
            return
        failed = f"{ctx.path}: process {process.pid} exited with status {status}"
        if status == EXIT_PART_GAVE_UP:
            raise ChildProcessGaveUp(f"{failed}: its actors gave up")
        if status == EXIT_PART_CONFIG:  # its node's file changed (or no longer reads)
            raise GiveUpNow(f"{failed}: it refused its node's config (its stderr says why)")
        raise ChildProcessFailed(failed)


async def _report_health(ctx: ActorContext, stdin: trio.abc.SendStream) -> None:
    """Tell the child what is down in the node but in itself, now and after every change."""

    def down() -> dict[str, dict[str, str]]:  # the main process's, the other children's
        return {
            "down": {
                p: r
                for p, r in ctx.health.down().items()
                if p != ctx.path and not p.startswith(f"{ctx.path}/")
            }
        }

    await send_changes(ctx, stdin, down)  # its end gone: its exit is handled by run()


async def send_changes(
    ctx: ActorContext, stream: trio.abc.SendStream, now: Callable[[], Any]
) -> None:
    """Write ``now()`` to ``stream`` as a JSON line at once and again whenever a change to
    ``ctx.health`` changes it (one made while a line is being sent is not missed), until
    the other end is gone. Both ends of the health pipes (``_report_health``,
    ``runtime.node``) report so."""
    sent: Any = None
    while True:
        seen = ctx.health.changes.value
        value = now()
        if value != sent:
            try:
                await stream.send_all(json.dumps(value).encode() + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            sent = value
        await ctx.health.changes.wait_value(lambda v, seen=seen: v != seen)


async def lines_of(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    """The lines ``stream`` carries (without their newline), until it ends."""
    pending = b""
    async for chunk in stream:
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line


async def _take_reports(ctx: ActorContext, fd: int, status: Callable[[], int | None]) -> None:
    """Take a child's reports on its health (``runtime.node``: one JSON line per change,
    ``{"ready": bool, "down": {path: reason}}``) into the node's, its paths under this
    actor's (``node/processes/consumers-1/consumers/email``): not ready until its tree has
    started, nor while an actor in it is down; what is still in the pipe once the process
    has exited (``status`` is its exit status) is passed over. Owns ``fd``."""
    async with trio.lowlevel.FdStream(fd) as stream:
        async for line in lines_of(stream):
            try:
                report = json.loads(line)
                down = {
                    f"{ctx.path}/{str(path).partition('/')[2] or path}": str(why)
                    for path, why in report["down"].items()
                }
                if not report["ready"]:
                    down[f"{ctx.path}/{STARTING}"] = "starting"
            except (ValueError, KeyError, TypeError, AttributeError):
                ctx.log.warning(
                    "process_report_unreadable", line=line[:200].decode(errors="replace")
                )
                continue
            if status() is None:  # its exit said already: not ready
                ctx.health.report(ctx.path, down)


async def _relay_lines(stdout: trio.abc.ReceiveStream, done: trio.Event) -> None:
    """Copy a child's output to ours in whole lines, until it ends."""
    pending = b""
    async for chunk in stdout:
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if cut:
            write_lines(pending[:cut].decode("utf-8", "replace"))
            pending = pending[cut:]
    if pending:
        write_lines(pending.decode("utf-8", "replace") + "\n")
    done.set()
