"""An action whose applying node is killed (SIGKILL) half-way is finished by another
node's resumer, and a repeated request changes nothing more: every matched task is
triggered exactly once (one stream entry each), none skipped. Real node processes, a
real Redis; the action is paced ([actions] rate) so the kill lands mid-way."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from actors.admin.client import ApiUnavailable, Client
from actors.store.keys import Keys
from tests.api_node import ADMIN, ApiNode, api_node, unique, wait_until, write_api_config

FAR = {"kind": "interval", "every_s": 3600, "start_ms": 4_000_000_000_000}
TASKS = 2000
ACTIONS = "\n[actions]\nbatch = 50\nrate = 800\nlease_s = 2\nresume_interval_s = 0.2\n"


@contextlib.contextmanager
def node(redis_url: str, workdir: Path, namespace: str) -> Iterator[ApiNode]:
    workdir.mkdir()
    config = write_api_config(workdir / "node.toml", redis_url, namespace, consumers=ACTIONS)
    with api_node(config, namespace) as started:
        yield started


def partitions_done(db: redis.Redis, keys: Keys, action_id: str) -> int:
    return sum(
        db.hget(keys.action_progress(p, action_id), "done") == b"1" for p in range(keys.partitions)
    )


def test_a_node_killed_mid_action_is_finished_by_another_and_no_task_fires_twice(
    redis_url: str, tmp_path: Path, db: redis.Redis
) -> None:
    namespace = unique("resume").replace("-", "")
    kind, action_id = "crash", unique("trigger-all")
    keys = Keys(namespace, 16)
    with (
        node(redis_url, tmp_path / "a", namespace) as a,
        node(redis_url, tmp_path / "b", namespace) as b,
    ):
        ids = [f"t{i:05d}" for i in range(TASKS)]
        with Client(a.url, *ADMIN) as client:
            client.create_tasks([{"type": kind, "schedule": FAR, "task_id": t} for t in ids])
        outcome: list[Any] = []

        def post() -> None:
            with Client(a.url, *ADMIN, timeout_s=120) as client:
                try:
                    outcome.append(client.tasks_action("trigger", {"type": kind},
                                                       action_id=action_id))  # fmt: skip
                except ApiUnavailable as exc:
                    outcome.append(exc)

        poster = threading.Thread(target=post)
        poster.start()
        wait_until(lambda: partitions_done(db, keys, action_id) >= 3, 60)
        a.node.proc.kill()  # SIGKILL, mid-action
        poster.join(30)
        assert outcome and isinstance(outcome[0], ApiUnavailable)
        done_at_kill = partitions_done(db, keys, action_id)
        assert done_at_kill < keys.partitions, "the action ended before the kill"

        with Client(b.url, *ADMIN) as client:
            state = wait_until(lambda: (s := client.action_status(action_id))["done"] and s, 60)
            assert (state["count"], state["changed"], state["failed_count"]) == (TASKS, TASKS, 0)
            assert state["partitions_done"] == keys.partitions
            assert any(e["action_id"] == action_id for e in b.node.events("action_resumed"))

            entries: list[Any] = db.xrange(keys.queue(kind))  # type: ignore[assignment]
            fired = sorted(dict(e)[b"task_id"].decode() for _, e in entries)
            assert fired == ids  # each task once: none twice, none skipped

            again = client.tasks_action("trigger", {"type": kind}, action_id=action_id)
            assert (again["done"], again["changed"]) == (True, TASKS)
            assert db.xlen(keys.queue(kind)) == TASKS
        (summary,) = [e for e in b.node.events("tasks_action") if e["action_id"] == action_id]
        assert summary["changed"] == TASKS
