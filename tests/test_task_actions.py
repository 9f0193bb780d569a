"""Actions over selected tasks (``POST /v1/tasks/actions``) against a real node and a real
Redis: a selector matches what the listing returns, a dry run writes nothing, each action
changes the matched tasks and no other (with its lifecycle lines and one summary line),
refusals write nothing, a repeat with the same id changes nothing twice, and the CLI's
``--selector``. The crash of the applying node: test_action_resume.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import trio

from actors.admin.client import ApiError, Client
from actors.store.flights import ENDED_OK, FlightEnd, Planned
from actors.store.keys import Keys
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.redis_io import RedisClient
from tests.api_node import (
    ADMIN,
    READER,
    ApiNode,
    api_node,
    cli_environment,
    unique,
    write_api_config,
)
from tests.cli_runner import run_in_process

FAR = {"kind": "interval", "every_s": 3600, "start_ms": 4_000_000_000_000}
METRONOME = Path(sys.executable).parent / "metronome"


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    namespace = f"acts{os.getpid()}{unique('n')[-6:]}"
    config = write_api_config(
        tmp_path_factory.mktemp("actions") / "node.toml", redis_url, namespace,
        api_extra="", consumers="\n[actions]\nbatch = 7\n",
    )  # fmt: skip
    with api_node(config, namespace) as node:
        yield node


def make(client: Client, kind: str, n: int, **labels: str) -> list[str]:
    """``n`` tasks of a type that never fire during the test, with these labels."""
    ids = [unique(f"{kind}{i}") for i in range(n)]
    tasks = [{"type": kind, "schedule": FAR, "task_id": t, "labels": labels} for t in ids]
    client.create_tasks(tasks)
    return ids


def statuses(client: Client, ids: list[str]) -> set[str]:
    return {client.get_task(t)["status"] for t in ids}


def snapshot(db: redis.Redis, namespace: str) -> dict[bytes, Any]:
    """Every key of the namespace and its content, but what the node writes on its own
    (nonces: one per request; pollers' leases and membership, presence)."""
    out = {}
    for key in db.scan_iter(match=f"*{namespace}*", count=1000):
        if b":nonce:" in key or key.endswith((b":poller", b":pollers", b":nodes")):
            continue
        kind = db.type(key)
        out[key] = (
            db.hgetall(key) if kind == b"hash" else db.zrange(key, 0, -1, withscores=True)
            if kind == b"zset" else db.xlen(key) if kind == b"stream" else db.dump(key)
        )  # fmt: skip
    return out


def test_a_selector_matches_the_listing_and_a_dry_run_writes_nothing(
    client: Client, api: ApiNode, db: redis.Redis
) -> None:
    kind = unique("sel")
    acme = make(client, kind, 30, tenant="acme")
    other = make(client, kind, 12, tenant="other")
    client.pause(acme[0])
    before = snapshot(db, api.namespace)
    cases: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
        ({"type": kind}, {"task_type": kind}),
        ({"labels": {"tenant": "acme"}}, {"labels": {"tenant": "acme"}}),
        ({"type": kind, "status": "active", "labels": {"tenant": "acme"}},
         {"task_type": kind, "status": "active", "labels": {"tenant": "acme"}}),
        ({"ids": [*acme[:3], *other[:2], "no-such-task"], "labels": {"tenant": "other"}}, None),
    ]  # fmt: skip
    for selector, listing in cases:
        dry = client.tasks_action("pause", selector, dry_run=True)
        if listing is None:
            expected = set(other[:2])
        else:
            kw = {k: v for k, v in listing.items() if k != "task_type"}
            expected = {t["task_id"] for t in client.iter_tasks(listing.get("task_type"), **kw)}
        assert dry["action_id"] is None and dry["dry_run"] is True
        assert dry["count"] == len(expected), selector
        assert set(dry["sample"]) <= expected and len(dry["sample"]) == min(20, len(expected))
    assert snapshot(db, api.namespace) == before


def test_refusals_write_nothing(client: Client, api: ApiNode, db: redis.Redis) -> None:
    kind = unique("ref")
    make(client, kind, 3)
    before = snapshot(db, api.namespace)
    with pytest.raises(ApiError) as empty:
        client.tasks_action("pause", {})
    assert empty.value.status == 422 and "all" in empty.value.detail
    for body, field in [
        ({"selector": {"type": kind}, "action": "explode"}, "action"),
        ({"selector": {"type": kind, "colour": "red"}, "action": "pause"}, "selector.colour"),
        ({"selector": {"status": "sleepy"}, "action": "pause"}, "selector.status"),
        ({"selector": {"type": kind, "labels": []}, "action": "pause"}, "selector.labels"),
        (
            {"selector": {"type": kind, "labels": {"bad key": "v"}}, "action": "pause"},
            "selector.labels",
        ),
        (
            {"selector": {"type": kind, "labels": {"a=b": "c"}}, "action": "pause"},
            "selector.labels",
        ),
        ({"selector": {"type": kind}, "action": "stop", "note": "why"}, "note"),
        ({"selector": {"type": kind}, "action": "backfill"}, "start_ms"),
        # A dry run is refused as the call would be: a window in the future.
        (
            {
                "selector": {"type": kind},
                "action": "backfill",
                "start_ms": 0,
                "end_ms": 4_000_000_000_000,
                "dry_run": True,
            },
            "end_ms",
        ),
    ]:
        with pytest.raises(ApiError) as refused:
            client.request("POST", "/v1/tasks/actions", body=body)
        assert refused.value.status == 422, body
        assert field in [e["field"] for e in refused.value.errors], refused.value.errors
    with Client(api.url, *READER) as reader:
        with pytest.raises(ApiError) as read_only:
            reader.tasks_action("pause", {"type": kind})
        assert read_only.value.status == 403
    assert snapshot(db, api.namespace) == before


def test_pause_resume_stop_delete_change_the_matched_tasks_only(
    client: Client, api: ApiNode, db: redis.Redis
) -> None:
    kind = unique("act")
    acme = make(client, kind, 25, tenant="acme")
    other = make(client, kind, 5, tenant="other")
    selector = {"type": kind, "labels": {"tenant": "acme"}}
    client.stop(acme[0])  # a stopped task cannot be paused: it fails, the others do not

    paused = client.tasks_action("pause", selector, note="incident 42", action_id=unique("a"))
    assert (paused["count"], paused["changed"], paused["unchanged"]) == (25, 24, 0)
    assert paused["failed"] == [{"task_id": acme[0], "reason": "cannot pause a stopped task"}]
    assert paused["done"] is True and paused["failed_count"] == 1
    assert statuses(client, acme[1:]) == {"paused"} and statuses(client, other) == {"active"}
    assert client.get_task(acme[1])["note"]["note"] == "incident 42"
    assert client.get_task(acme[1])["note"]["by"] == ADMIN[0]
    lines = [e for e in api.node.events("paused") if e.get("action_id") == paused["action_id"]]
    assert sorted(e["task_id"] for e in lines) == sorted(acme[1:])
    (summary,) = [
        e for e in api.node.wait_for("tasks_action") if e["action_id"] == paused["action_id"]
    ]
    assert (summary["action"], summary["key"], summary["changed"]) == ("pause", ADMIN[0], 24)
    assert summary["selector"] == selector

    state = client.action_status(paused["action_id"])
    assert state["state"] == "done" and state["partitions_done"] == state["partitions"] == 16
    assert (state["changed"], state["note"], state["key_id"]) == (24, "incident 42", ADMIN[0])

    again = client.tasks_action("pause", selector, note="incident 42",
                                action_id=paused["action_id"])  # fmt: skip
    assert {k: again[k] for k in ("count", "changed")} == {"count": 25, "changed": 24}
    with pytest.raises(ApiError) as other_action:
        client.tasks_action("resume", selector, action_id=paused["action_id"])
    assert other_action.value.status == 409

    resumed = client.tasks_action("resume", {"type": kind, "status": "paused"})
    assert resumed["changed"] == 24 and statuses(client, acme[1:]) == {"active"}
    assert all(client.get_task(t)["next_run_ms"] == FAR["start_ms"] for t in acme[1:3])

    stopped = client.tasks_action("stop", {"ids": other})
    assert stopped["changed"] == 5 and statuses(client, other) == {"stopped"}
    assert statuses(client, acme[1:]) == {"active"}

    deleted = client.tasks_action("delete", {"type": kind, "status": "stopped"})
    assert deleted["changed"] == 6
    assert len(list(client.iter_tasks(kind))) == 24
    keys = Keys(api.namespace, 16)
    for task_id in [acme[0], *other]:
        assert db.hget(keys.labels(keys.partition_of(task_id)), task_id) is None
    assert {e["task_id"] for e in api.node.events("deleted")} >= {acme[0], *other}


def test_trigger_and_backfill_append_once_per_task_however_often_repeated(
    client: Client, api: ApiNode, db: redis.Redis
) -> None:
    kind = unique("trg")
    ids = make(client, kind, 20, team="ops")
    spare = make(client, kind, 3, team="dev")
    client.stop(ids[-1])
    action_id = unique("t")
    keys = Keys(api.namespace, 16)
    triggered = client.tasks_action("trigger", {"labels": {"team": "ops"}}, action_id=action_id)
    assert (triggered["changed"], triggered["failed_count"]) == (19, 1)
    assert "stopped" in triggered["failed"][0]["reason"]
    again = client.tasks_action("trigger", {"labels": {"team": "ops"}}, action_id=action_id)
    assert again["changed"] == 19
    entries: list[Any] = db.xrange(keys.queue(kind))  # type: ignore[assignment]
    fired = sorted(dict(e)[b"task_id"].decode() for _, e in entries)
    assert fired == sorted(ids[:-1])  # one each, none for the stopped one nor the others
    assert {dict(e)[b"due_ms"] for _, e in entries} == {
        str(client.action_status(action_id)["created_ms"]).encode()
    }
    assert not set(spare) & set(fired)

    now = int(db.time()[0]) * 1000
    every = {"kind": "interval", "every_s": 60, "start_ms": now - 3_600_000}
    past = unique("bf")
    client.create_tasks([{"type": past, "schedule": every, "task_id": unique(f"bf{i}")}
                         for i in range(3)])  # fmt: skip
    window = (now - 3_000_000, now - 2_700_000)  # 5 grid times each
    done = client.tasks_action("backfill", {"type": past}, start_ms=window[0], end_ms=window[1])
    assert (done["count"], done["changed"]) == (3, 3)
    assert db.xlen(keys.queue(past)) >= 15
    length = db.xlen(keys.queue(past))
    repeat = client.tasks_action("backfill", {"type": past}, start_ms=window[0], end_ms=window[1])
    assert (repeat["changed"], repeat["unchanged"]) == (0, 3)
    assert db.xlen(keys.queue(past)) == length


def test_the_cli_counts_with_dry_run_and_applies_only_with_yes(
    client: Client, api: ApiNode
) -> None:
    kind = unique("cli")
    ids = make(client, kind, 4, tenant="acme")
    env = cli_environment(api)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in_process(list(args), env)

    dry = cli("--json", "tasks", "pause", "--selector", f"type={kind},tenant=acme", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["count"] == 4
    human = cli("tasks", "pause", "--selector", f"type={kind},tenant=acme", "--dry-run")
    assert "4 tasks match" in human.stdout
    unconfirmed = cli("tasks", "pause", "--selector", f"type={kind},tenant=acme")
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    assert statuses(client, ids) == {"active"}
    applied = cli("tasks", "pause", "--selector", f"type={kind},tenant=acme", "--yes")
    assert applied.returncode == 0, applied.stderr
    assert "4 changed" in applied.stdout and statuses(client, ids) == {"paused"}
    one = cli("tasks", "resume", ids[0])  # the single-id form still works
    assert one.returncode == 0 and statuses(client, ids[:1]) == {"active"}
    # A key given twice with two values matches nothing: refused, not the last one alone.
    other = make(client, kind, 1, tenant="globex")
    both = cli("tasks", "rm", "--selector", f"type={kind},tenant=acme,tenant=globex", "--yes")
    assert both.returncode == 2 and "'tenant' is given twice" in both.stderr
    assert statuses(client, other) == {"active"}


def test_a_last_fate_selector_is_kept_from_the_dry_run_to_the_apply(
    client: Client, api: ApiNode, db: redis.Redis
) -> None:
    kind = unique("fate").replace("-", "")
    ids = make(client, kind, 6)
    dead, alive = ids[:2], ids[2:]
    keys = Keys(api.namespace, 16)
    for task_id in dead:  # the latest occurrence of each: dead (a ring of one entry)
        ring = (1_700_000_000_000).to_bytes(6, "big") + bytes([2]) + bytes(11)
        db.hset(keys.history(keys.partition_of(task_id)), task_id, ring)
    selector = {"type": kind, "last_fate": "dead"}
    dry = client.tasks_action("delete", selector, dry_run=True)
    assert dry["count"] == 2 and set(dry["sample"]) == set(dead)
    done = client.tasks_action("delete", selector)
    assert (done["count"], done["changed"]) == (2, 2)
    assert {t["task_id"] for t in client.iter_tasks(kind)} == set(alive)
    assert client.action_status(done["action_id"])["selector"] == selector


def test_a_trigger_action_on_a_paused_task_leaves_its_waiting_grid_fire_waiting(
    client: Client, api: ApiNode, redis_url: str
) -> None:
    """A buffer_one task, paused with a grid fire waiting behind one that ended: the
    action's own fire runs (a manual run is an explicit request), and the grid fire keeps
    waiting for the task's resume (started by the action, it would run during the pause,
    appended with the action's code)."""
    kind = unique("buf").replace("-", "")
    schedule = {**FAR, "overlap": "buffer_one"}
    (task_id,) = [unique("b")]
    client.create_task(kind, schedule, None, task_id)
    client.pause(task_id)

    async def in_flight_then_waiting() -> None:
        redis_client = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
        store = TaskStore(redis_client, api.namespace)
        scripts = await store.scripts()
        p = (await store.keys()).partition_of(task_id)
        await scripts.decide_overlaps("c1", {p: [Planned(task_id, "1", [1000, 2000])]})
        await scripts.end_flights([FlightEnd(task_id, ENDED_OK, 1000)])
        await redis_client.aclose()

    trio.run(in_flight_then_waiting)
    done = client.tasks_action("trigger", {"ids": [task_id]}, overlap="buffer_one")
    assert done["done"]
    db = redis.Redis.from_url(redis_url)
    entries: Any = db.xrange(Keys(api.namespace, 16).queue(kind))
    assert [e[1][b"due_ms"] for e in entries] != [b"2000"] and len(entries) == 1
    keys = Keys(api.namespace, 16)
    flight: Any = db.hget(keys.flights(keys.partition_of(task_id)), task_id)
    assert "2000" in flight.decode().split("|")[3]  # still waiting
    db.close()
