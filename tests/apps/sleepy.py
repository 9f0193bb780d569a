"""A tiny node application for testing ``python -m runtime`` as a real process.

``[sleepy] finish_s``: how long its graceful worker needs to finish after a stop request.
``[sleepy] crash``: the worker crashes at once, forever (to make the root give up).
"""

from __future__ import annotations

import attrs
import trio

from runtime.actor import ActorContext, TaskStatus
from runtime.app import Invocation
from runtime.config import LogSection, NodeSection
from runtime.supervisor import ChildSpec, SupervisorSpec, supervisor


@attrs.frozen
class SleepySection:
    finish_s: float = 0.2
    crash: bool = False


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
            raise RuntimeError("sleepy worker crashed on purpose")
        await ctx.wait_stop_requested()
        ctx.log.info("worker_finishing", finish_s=section.finish_s)
        await trio.sleep(section.finish_s)
        ctx.log.info("worker_finished")

    return supervisor(
        "node",
        [ChildSpec("worker", worker, graceful=True, shutdown_s=30)],
        SupervisorSpec(max_restarts=2, period_s=10, backoff_base_s=0.01),
    )
