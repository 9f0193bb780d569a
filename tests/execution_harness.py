"""Run a node's tree in-process against the test Redis, and read what its handlers did."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from actors.app import build_tree
from actors.config import Config, ConsumerSection, ExecutionSection, SchedulerSection
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.keys import GROUP
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.app import Invocation
from runtime.config import NodeSection, RedisSection
from runtime.logging import get_logger
from tests.node_process import NodeProcess
from tests.waiting import eventually

T = TypeVar("T")


def node_config(
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    consumers: dict[str, ConsumerSection],
    *,
    pollers: int = 1,
    grace_s: float = 5.0,
    name: str = "n1",
) -> Config:
    return Config(
        node=NodeSection(name=name, shutdown_grace_s=grace_s),
        redis=RedisSection(url=redis_url),
        namespace=namespace,
        scheduler=SchedulerSection(pollers=pollers, partitions=4, max_tick_s=0.05),
        execution=ExecutionSection(
            results_log=str(tmp_path / f"results-{name}.jsonl"), claimer_interval_s=0.1
        ),
        consumers=consumers,
    )


def fault_node_toml(
    tmp_path: Path, url: str, namespace: str, *, cluster: bool = False, partitions: int = 4
) -> Path:
    """The node.toml of the fault tests (Redis killed, stalled, failed over): short
    timeouts, leases and claim leases, so a fault is noticed and ridden out in seconds."""
    path = tmp_path / "node.toml"
    path.write_text(
        f'namespace = "{namespace}"\n'
        '[node]\nname = "n1"\nshutdown_grace_s = 5\n'
        f'[redis]\nurl = "{url}"\n'
        + ("cluster = true\n" if cluster else "")
        + "connect_timeout_s = 0.5\nsocket_timeout_s = 1\n"
        f"[scheduler]\npollers = 1\npartitions = {partitions}\nmax_tick_s = 0.05\n"
        "claim_lease_ms = 1000\n"
        f'[execution]\nresults_log = "{tmp_path / "results.jsonl"}"\nclaimer_interval_s = 0.2\n'
        '[consumers.work]\nhandler = "tests.handlers.jobs:noop"\nconcurrency = 20\nlease_s = 3\n'
    )
    return path


@asynccontextmanager
async def running_node(config: Config) -> AsyncIterator[ActorContext]:
    """The node's tree runs inside the block; leaving it stops the node gracefully."""
    ctx = ActorContext("node", config.node.shutdown_grace_s, get_logger(actor="node"))
    async with trio.open_nursery() as nursery:
        await nursery.start(build_tree(config, Invocation(Path("node.toml"))).run, ctx)
        try:
            yield ctx
        finally:
            ctx.stop_requested.value = True


def records(path: Path) -> list[dict[str, Any]]:
    """What the test handlers recorded (``tests.handlers.jobs``): whole lines only (a node
    process may be halfway through writing the last one)."""
    if not path.exists():
        return []
    whole = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


async def wait_until(predicate: Any, timeout_s: float = 60.0, poll_s: float = 0.02) -> None:
    """Until ``await predicate()`` holds (a Redis read, say); fails after ``timeout_s``."""
    await eventually(predicate, timeout_s, poll_s=poll_s)


async def one_message_queued(store: TaskStore, task_type: str, task_id: str) -> tuple[str, str]:
    """A message for ``task_id`` in its type's stream (the group created): (stream, id)."""
    keys = await store.keys()
    stream = keys.queue(task_type)
    await store.client.execute("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
    msg_id = await store.client.execute(
        "XADD", stream, "*", "task_id", task_id, "schedule_id", f"{task_id}:1",
        "type", task_type, "payload", "1", "attempt", "0", "due_ms", "1",
    )  # fmt: skip
    return stream, msg_id.decode()


async def stream_entries(store: TaskStore, key: str) -> list[dict[str, str]]:
    entries = await store.client.execute("XRANGE", key, "-", "+")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in entries]


async def periodic_tasks(
    store: TaskStore, count: int = 10, every_s: float = 0.5
) -> tuple[list[str], int]:
    """``count`` fire_all tasks every ``every_s`` from a second from now: (ids, first due)."""
    start_ms = await store.now_ms() + 1000
    schedule = Schedule("interval", every_s=every_s, start_ms=start_ms, misfire="fire_all")
    created = await store.create_many([TaskSpec("work", schedule)] * count)
    return [c.task_id for c in created], start_ms


async def wait_every_fire_ran(
    path: Path, ids: list[str], start_ms: int, until_ms: int, every_ms: int = 500,
    timeout_s: float = 60.0,
) -> int:  # fmt: skip
    """Until every grid time of these tasks from ``start_ms`` to ``until_ms`` has started at
    least once (call it while the node runs: a task still catching up on owed fires is
    not a loss); fails naming the fires still missing after ``timeout_s``. How many."""
    expected = {f"{t}:{due}" for t in ids for due in range(start_ms, until_ms, every_ms)}
    with trio.move_on_after(timeout_s):
        while not expected <= {r["schedule_id"] for r in records(path)}:  # noqa: ASYNC110
            await trio.sleep(0.1)
    missed = sorted(expected - {r["schedule_id"] for r in records(path)})
    assert not missed, f"{len(missed)} fires never ran, e.g. {missed[:3]}"
    return len(expected)


async def fault_under_a_running_node(
    config: Path, record: Path, ids: list[str], start_ms: int,
    fault: Callable[[NodeProcess], Awaitable[T]],
) -> tuple[NodeProcess, T]:  # fmt: skip
    """Start a node on ``config``, let 30 fires run, strike with ``fault(node)``, then wait
    (the node running) until every fire of ``ids`` from ``start_ms`` to 2 s after the fault
    has run: each must, at least 50 of them. The node must still be up, stop on SIGTERM
    with status 0, and have logged no actor crash. Returns the node (for its log) and
    what ``fault`` returned."""
    node = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(node.wait_for, "consumer_ready")
        await wait_records(record, lambda rs: len(rs) >= 30)
        struck = await fault(node)
        until_ms = int(time.time() * 1000) + 2000
        assert await wait_every_fire_ran(record, ids, start_ms, until_ms) >= 50
        assert node.proc.poll() is None, node.stderr_text()
    finally:
        node.signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(node.wait)
    assert code == 0
    crashes = [e for e in node.events() if e["event"] == "actor_crashed"]
    assert not crashes, json.dumps(crashes[0])[-3000:]
    return node, struck


async def wait_records(path: Path, predicate: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The handlers' records once ``predicate`` holds for them (fails after ``timeout_s``)."""

    def found() -> tuple[list[dict[str, Any]]] | None:
        now = records(path)
        return (now,) if predicate(now) else None

    held: tuple[list[dict[str, Any]]] = await eventually(
        found, timeout_s, poll_s=0.05, what="the handlers' records"
    )
    return held[0]
