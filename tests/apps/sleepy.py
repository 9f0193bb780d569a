"""A tiny node application for testing ``python -m runtime`` as a real process.

``[sleepy] finish_s``: how long its graceful worker needs to finish after a stop request.
``[sleepy] crash``: the worker crashes at once, forever (to make the root give up), or
``crash_after_s`` after each start. ``[sleepy] cleanup_s``: a shielded cleanup that long
once the worker is cancelled. ``[sleepy] part``: the worker's tree runs in a child
process (``--part worker``), under a parent that gives up after three failed restarts in a
row, each one counted unless the child stayed up a second.
"""

from __future__ import annotations

import attrs
import trio

from runtime.actor import ActorContext, TaskStatus
from runtime.app import Invocation
from runtime.config import LogSection, NodeSection
from runtime.process import ChildProcess, part_argv
from runtime.supervisor import ChildSpec, SupervisorSpec, supervisor


@attrs.frozen
class SleepySection:
    finish_s: float = 0.2
    crash: bool = False
    crash_after_s: float = 0.0
    part: bool = False
    cleanup_s: float = 0.0
    """How long the worker's shielded cleanup takes once it is cancelled (0: none)."""


@attrs.frozen
class Config:
    node: NodeSection = attrs.field(factory=NodeSection)
    log: LogSection = attrs.field(factory=LogSection)
    sleepy: SleepySection = attrs.field(factory=SleepySection)


def build_tree(config: Config, invocation: Invocation) -> ChildSpec:
    section = config.sleepy

    async def worker(ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        if section.crash:
            await trio.sleep(section.crash_after_s)
            raise RuntimeError("sleepy worker crashed on purpose")
        try:
            await ctx.wait_stop_requested()
            ctx.log.info("worker_finishing", finish_s=section.finish_s)
            await trio.sleep(section.finish_s)
            ctx.log.info("worker_finished")
        finally:
            if section.cleanup_s:
                with ctx.cleanup():
                    ctx.log.info("cleanup_started")
                    await trio.sleep(section.cleanup_s)
                    ctx.log.info("cleanup_done")

    tree = supervisor(
        "node",
        [ChildSpec("worker", worker, graceful=True, shutdown_s=30)],
        SupervisorSpec(max_restarts=2, period_s=10, backoff_base_s=0.01),
    )
    if not section.part or invocation.part is not None:
        return tree
    child = ChildProcess(part_argv(invocation.config_path, "worker", invocation.config_digest))
    return supervisor(
        "node",
        [ChildSpec("worker", child.run, graceful=True, shutdown_s=30)],
        SupervisorSpec(max_restarts=100, period_s=1, backoff_base_s=0.01, max_attempts=3),
    )
