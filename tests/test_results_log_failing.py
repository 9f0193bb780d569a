"""A results log that cannot be written (the disk full, its path taken away): the batch
waits for it, its messages pending, and is acknowledged once its lines are written; no
handler runs again for want of them. A real Redis, a node's tree in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.config import ConsumerSection
from actors.store.keys import GROUP
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.execution_harness import (
    node_config,
    one_message_queued,
    records,
    running_node,
    wait_until,
)


async def test_a_batch_waits_for_its_results_lines_and_runs_once(
    redis_client: RedisClient, redis_url: str, namespace: str, tmp_path: Path, record: Path,
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:  # fmt: skip
    store = TaskStore(redis_client, namespace, default_partitions=4)
    results = tmp_path / "results-n1.jsonl"
    results.mkdir()  # opening it to append fails (IsADirectoryError), as a full disk would
    stream, msg_id = await one_message_queued(store, "p", "x")
    section = ConsumerSection(handler="tests.handlers.jobs:noop", lease_s=2)
    config = node_config(redis_url, namespace, tmp_path, {"p": section}, pollers=0)

    def events(name: str) -> list[dict[str, Any]]:
        return [e for e in log_lines() if e.get("event") == name]

    async def pending() -> int:
        summary = await redis_client.execute("XPENDING", stream, GROUP)
        return int(summary["pending"])

    async with running_node(config):
        await wait_until(lambda: _async(bool(events("results_log_failed"))))
        assert len(records(record)) == 1  # it ran, and waits for its line
        assert await pending() == 1  # not acknowledged without its line
        (failed,) = events("results_log_failed")
        assert (failed["path"], failed["lines"]) == (str(results), 1)
        results.rmdir()  # writable again

        async def acknowledged() -> bool:
            return await pending() == 0

        await wait_until(acknowledged)
        assert len(events("results_log_written")) == 1
    lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    assert [(line["task_id"], line["msg_id"]) for line in lines] == [("x", msg_id)]
    assert len(records(record)) == 1  # never run again
    assert len(events("results_log_failed")) == 1  # one line for the whole wait


async def _async(value: bool) -> bool:
    return value
