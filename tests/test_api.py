"""The HTTP API against a real node process and a real Redis: every endpoint, validation,
problem details, body limit, concurrency on one task; what is in Redis afterwards is the
judge. Authentication has its own module (test_api_auth.py), the CLI too (test_cli.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import trio

from actors.admin.client import ApiError, Client
from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.keys import Keys
from actors.store.queue_rows import as_text
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.redis_io import RedisClient
from runtime.version import __version__
from tests import stored
from tests.api_node import (
    ADMIN,
    READER,
    WORK_AND_DOOMED,
    ApiNode,
    recording_api_node,
    unique,
    wait_until,
)

CONSUMERS = (
    WORK_AND_DOOMED
    + """[consumers.slow]
handler = "tests.handlers.jobs:sleepy"
concurrency = 1
[consumers.flaky]
handler = "tests.handlers.jobs:failing"
max_attempts = 3
backoff_base_s = 60
"""
)
TYPES = 'task_types = ["work", "doomed", "flaky", "idle", "slow"]\nmax_body_bytes = 1048576'
#: First fire in 2100: tasks that must not fire while a test looks at them.
LATER = 4102444800000
EVERY_HOUR = {"kind": "interval", "every_s": 3600, "start_ms": LATER}


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url,
        tmp_path_factory.mktemp("api"),
        "api",
        record_file,
        consumers=CONSUMERS,
        api_extra=TYPES,
    ) as node:
        yield node


def records(path: Path, task_id: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [line for line in lines if line["task_id"] == task_id]


# -- create, get, list ----------------------------------------------------------------


def test_create_is_idempotent_with_a_client_id_and_conflicts_on_another_definition(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    task_id = unique("report")
    first = client.create_task("idle", EVERY_HOUR, {"to": "ops"}, task_id)
    again = client.create_task("idle", EVERY_HOUR, {"to": "ops"}, task_id)
    assert first == {"task_id": task_id, "created": True}
    assert again == {"task_id": task_id, "created": False}
    with pytest.raises(ApiError) as refused:
        client.create_task("idle", EVERY_HOUR, {"to": "someone else"}, task_id)
    assert refused.value.status == 409 and refused.value.code == "conflict"
    assert stored.payload(db, keys, task_id) == {"to": "ops"}
    assert db.zscore(keys.schedule(keys.partition_of(task_id)), task_id) is not None
    task = client.get_task(task_id)
    assert task["status"] == "active" and task["payload"] == {"to": "ops"}
    assert task["schedule"] == {"kind": "interval", "every_s": 3600.0, "start_ms": LATER}


def test_create_refuses_bad_input_naming_the_field_and_writes_nothing(
    api: ApiNode, client: Client, db: redis.Redis, keys: Keys
) -> None:
    bad_id = unique("bad")
    cases = [
        ({"type": "idle", "schedule": {"kind": "interval"}, "task_id": bad_id}, "schedule"),
        ({"type": "idle", "schedule": {"kind": "cron", "cron": "61 * * * *"}, "task_id": bad_id},
         "schedule.cron"),
        ({"type": "nobody", "schedule": EVERY_HOUR, "task_id": bad_id}, "type"),
        ({"type": "bad type", "schedule": EVERY_HOUR, "task_id": bad_id}, "type"),
        ({"type": "idle", "schedule": EVERY_HOUR, "task_id": "has{brace}"}, "task_id"),
        ({"type": "idle", "schedule": EVERY_HOUR, "task_id": bad_id, "colour": 1}, ""),
        ({"type": "idle", "schedule": EVERY_HOUR, "task_id": bad_id, "payload": "x" * 70_000},
         "payload"),
        # Numbers past what a stored schedule holds: 422 naming the field, not a 500.
        ({"type": "idle", "schedule": {"kind": "interval", "every_s": 1e308}, "task_id": bad_id},
         "schedule.every_s"),
        ({"type": "idle", "schedule": {"kind": "interval", "every_s": 2**64}, "task_id": bad_id},
         "schedule.every_s"),
        # This node's rules for new schedules: [api] min_interval_s (1 s), five cron fields.
        ({"type": "idle", "schedule": {"kind": "interval", "every_s": 0.5}, "task_id": bad_id},
         "schedule.every_s"),
        ({"type": "idle", "schedule": {"kind": "cron", "cron": "0 0 * * * *"}, "task_id": bad_id},
         "schedule.cron"),
    ]  # fmt: skip
    for body, field in cases:
        with pytest.raises(ApiError) as refused:
            client.request("POST", "/v1/tasks", body=body)
        assert refused.value.status == 422, body
        assert refused.value.code == "invalid"
        assert any(e["field"].startswith(field) for e in refused.value.errors), refused.value.errors
    assert "colour" in str(_problem(client, {"type": "idle", "schedule": EVERY_HOUR, "colour": 1}))
    nan = b'{"type": "idle", "schedule": {"kind": "interval", "every_s": 60}, "payload": NaN}'
    deep = b'{"type": "idle", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    raw_cases = [(b"{not json", 400), (b"[1, 2]", 422), (b"", 400), (nan, 400), (deep, 400)]
    for raw, expected in raw_cases:
        response = _raw_post(api, client, "/v1/tasks", raw)
        assert response.status_code == expected
        assert response.headers["content-type"] == "application/problem+json"
    assert not stored.exists(db, keys, bad_id)
    assert not stored.exists(db, keys, "has{brace}")
    # The same rules for an update, a bulk create, and a duplicate id within one bulk.
    client.create_task("idle", EVERY_HOUR, None, bad_id)
    with pytest.raises(ApiError) as refused:
        client.update_task(bad_id, schedule={"kind": "interval", "every_s": 0.01})
    assert refused.value.status == 422 and refused.value.errors[0]["field"] == "schedule.every_s"
    assert client.get_task(bad_id)["schedule"] == EVERY_HOUR
    twice = {"type": "idle", "schedule": EVERY_HOUR, "task_id": f"{bad_id}-twice"}
    fast = {"type": "idle", "schedule": {"kind": "interval", "every_s": 0.1}}
    with pytest.raises(ApiError) as refused:
        client.create_tasks([twice, fast, twice])
    fields = [e["field"] for e in refused.value.errors]
    assert fields == ["tasks[1].schedule.every_s", "tasks[2].task_id"], refused.value.errors
    assert not stored.exists(db, keys, f"{bad_id}-twice")


def test_input_that_broke_readers_is_refused_naming_the_problem_and_writes_nothing(
    api: ApiNode, client: Client, db: redis.Redis, keys: Keys
) -> None:
    """A lone surrogate escape (text UTF-8 cannot carry), a payload nested past every
    reader's stack, a directory of the zone database as a time zone, a cron of a million
    list items (seconds of CPU at each parse), a reserved task id,
    digits that are not ASCII and a cursor Redis would refuse: 4xx, never a 500, and
    nothing half-written (a surrogate note on an action once left a record no node could
    apply, crashing its resumers)."""
    task_id = unique("odd")
    client.create_task("idle", EVERY_HOUR, {"n": 1}, task_id)
    surrogate = b'{"selector": {"ids": ["%s"]}, "action": "pause", "note": "\\ud800"}' % (
        task_id.encode()
    )
    response = _raw_post(api, client, "/v1/tasks/actions", surrogate)
    assert response.status_code == 400 and "surrogate" in response.json()["detail"]
    assert client.get_task(task_id)["status"] == "active"
    payload = b'{"type": "idle", "schedule": {"kind": "interval", "every_s": 60}, '
    response = _raw_post(api, client, "/v1/tasks", payload + b'"payload": "\\udcff"}')
    assert response.status_code == 400
    deep: Any = 1
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ApiError) as refused:
        client.update_task(task_id, payload=deep)
    assert refused.value.status == 422 and refused.value.errors[0]["field"] == "payload"
    assert client.get_task(task_id)["payload"] == {"n": 1}
    with pytest.raises(ApiError) as refused:
        client.create_task("idle", {**EVERY_HOUR, "tz": "America"}, None, unique("tz"))
    (error,) = refused.value.errors
    assert error["field"] == "schedule.tz" and "/" not in error["message"]
    huge_cron = {"kind": "cron", "cron": "0" + ",0" * 500_000 + " * * * *"}  # a list, 1 MB
    with pytest.raises(ApiError) as refused:
        client.create_task("idle", huge_cron, None, unique("cron"))
    (error,) = refused.value.errors
    assert error["field"] == "schedule.cron" and "at most 512 characters" in error["message"]
    for reserved in ("actions", "bulk"):
        with pytest.raises(ApiError) as refused:
            client.create_task("idle", EVERY_HOUR, None, reserved)
        assert refused.value.status == 422 and refused.value.errors[0]["field"] == "task_id"
    for path in ("/v1/tasks?limit=%C2%B2", f"/v1/tasks/{task_id}/upcoming?n=%C2%B2",
                 "/v1/attention?cursor=0:99999999999999999999999"):  # fmt: skip
        with pytest.raises(ApiError) as refused:
            client.request("GET", path)
        assert 400 <= refused.value.status < 500, path
    unsigned = httpx.get(api.url + "/v1/tasks", headers={b"X-Metronome-Timestamp": b"\xb2"})
    assert 400 <= unsigned.status_code < 500
    # Bytes that are not UTF-8 in another producer's entry, dead-lettered as they came:
    # the type's dead letters and its tasks' explanations still answer.
    foreign = unique("foreign").encode()
    dead = db.xadd(
        keys.dlq("idle"),
        {b"task_id": foreign, b"payload": b"\xff", b"error": b"\xff", b"entry_id": b"0-1"},
    )
    queued = db.xadd(keys.queue("idle"), {b"task_id": b"\xff", b"due_ms": b"1"})
    try:
        entries = client.dead_letters("idle", limit=1000)["dead_letters"]
        (entry,) = [e for e in entries if e["task_id"] == foreign.decode()]
        assert entry["payload"] == "\ufffd"
        assert entry["entry_id"] == as_text(dead)  # its own, not a field of that name
        assert client.explain(task_id)["status"] == "active"  # an idle task: its stream read
    finally:  # the module's other tests count these streams
        db.xdel(keys.dlq("idle"), dead)
        db.xdel(keys.queue("idle"), queued)
    # Digits int() refuses ('²' is a digit to isdigit) in its not-run and flight records:
    # explain says they cannot be read.
    p = keys.partition_of(task_id)
    db.hset(keys.not_run(p), task_id, "²1 overlap ²1 -".encode())
    db.hset(keys.flights(p), task_id, "²||||".encode())
    facts = client.explain(task_id)
    assert "unreadable" in facts["not_run"] and "unreadable" in facts["flight"], facts
    db.hdel(keys.not_run(p), task_id)
    db.hdel(keys.flights(p), task_id)


def test_a_schedule_stored_before_a_rule_refuses_it_may_be_sent_again(
    api: ApiNode, client: Client, redis_url: str
) -> None:
    """A task stored with a schedule this node's rules refuse now (written by a store
    client, or before the rule): a PATCH sending it again as it is (to change the payload)
    is accepted; a schedule changed is held to the rules."""
    task_id = unique("older")
    slow = Schedule("interval", every_s=0.5, start_ms=LATER)  # below [api] min_interval_s
    hashed_id = unique("hashed")
    hashed = Schedule("cron", cron="H * * * * *", start_ms=LATER)  # six fields, one H

    async def create() -> None:
        redis = RedisClient.from_settings(redis_url, RedisSection(url=redis_url))
        try:
            store = TaskStore(redis, api.namespace)
            await store.create(TaskSpec("idle", slow, task_id=task_id))
            await store.create(TaskSpec("idle", hashed, task_id=hashed_id))
        finally:
            await redis.aclose()

    trio.run(create)
    again = client.request("POST", "/v1/tasks", body={
        "type": "idle", "task_id": hashed_id, "schedule": hashed.to_dict()
    })  # fmt: skip
    assert again == {"task_id": hashed_id, "created": False}  # stored with H resolved
    # Created again as it is stored (a deploy script's create at every run): it exists.
    again = client.request("POST", "/v1/tasks", body={
        "type": "idle", "task_id": task_id, "schedule": slow.to_dict()
    })  # fmt: skip
    assert again == {"task_id": task_id, "created": False}
    bulk = client.request("POST", "/v1/tasks/bulk", body={"tasks": [
        {"type": "idle", "task_id": task_id, "schedule": slow.to_dict()}
    ]})  # fmt: skip
    assert (bulk["created"], bulk["existing"]) == (0, 1)
    for body in (  # another task, or another payload: held to the rules
        {"type": "idle", "task_id": unique("newer"), "schedule": slow.to_dict()},
        {"type": "idle", "task_id": task_id, "schedule": slow.to_dict(), "payload": 1},
    ):
        with pytest.raises(ApiError) as refused:
            client.request("POST", "/v1/tasks", body=body)
        assert refused.value.errors[0]["field"] == "schedule.every_s", refused.value.errors
    client.update_task(task_id, payload={"v": 2}, schedule=slow.to_dict())
    assert client.get_task(task_id)["payload"] == {"v": 2}
    with pytest.raises(ApiError) as refused:
        client.update_task(task_id, schedule={**slow.to_dict(), "every_s": 0.6})
    assert refused.value.errors[0]["field"] == "schedule.every_s", refused.value.errors


def _problem(client: Client, body: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        client.request("POST", "/v1/tasks", body=body)
    return refused.value


def _raw_post(api: ApiNode, client: Client, path: str, raw: bytes) -> httpx.Response:
    from actors.api.signing import sign

    headers = sign(client.key, "POST", path, raw, int(time.time() * 1000))
    return httpx.post(api.url + path, content=raw, headers=headers)


def test_a_problems_fields_are_key_paths_a_client_cannot_forge(
    api: ApiNode, client: Client
) -> None:
    """``errors[].field`` names a key path or nothing: a message with ``": "`` in it (the
    known keys) is not cut into a field, nor is a quoted id holding ``"; b: c"`` taken
    for a problem of a field ``b``; an integer no float holds is named too large."""
    unknown = _problem(client, {"type": "idle", "schedule": EVERY_HOUR, "colour": 1})
    assert [e["field"] for e in unknown.errors] == [""], unknown.errors
    assert "unknown key 'colour'" in unknown.errors[0]["message"]
    with pytest.raises(ApiError) as forged:
        client.request("GET", "/v1/tasks/a;%20b:%20c")
    assert [e["field"] for e in forged.value.errors] == ["task_id"], forged.value.errors
    label = _problem(
        client, {"type": "idle", "schedule": EVERY_HOUR, "labels": {"team-a": "x; y: z"}}
    )
    assert [e["field"] for e in label.errors] == ["labels.team-a"], label.errors
    huge = b'{"type": "idle", "schedule": {"kind": "interval", "every_s": 1' + b"0" * 400 + b"}}"
    response = _raw_post(api, client, "/v1/tasks", huge)
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == "schedule.every_s" and "too large" in error["message"], error


def test_a_body_giving_a_key_twice_is_refused_and_changes_nothing(
    api: ApiNode, client: Client
) -> None:
    """JSON parsers keep a repeated key's last value: an action whose selector gave its
    labels twice, the second empty, would have paused every task of the type."""
    tag = unique("twice")
    ids = [f"{tag}-{n}" for n in range(2)]
    for task_id, tenant in zip(ids, ("acme", tag), strict=True):
        client.create_task("idle", EVERY_HOUR, None, task_id, labels={"tenant": tenant})
    raw = (
        b'{"action": "pause", "selector": {"type": "idle", "labels": {"tenant": "%s"},'
        b' "labels": {}}}' % tag.encode()
    )
    refused = _raw_post(api, client, "/v1/tasks/actions", raw)
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "bad_json" and "'labels' is given twice" in refused.text
    assert {client.get_task(t)["status"] for t in ids} == {"active"}


def test_a_query_parameter_given_twice_is_refused_but_a_label_filter(
    api: ApiNode, client: Client
) -> None:
    """A query read with its last value would list paused tasks alone for
    ``status=active&status=paused``: refused, naming it; ``label`` filters add up."""
    from actors.api.signing import sign

    def get(path: str) -> httpx.Response:
        headers = sign(client.key, "GET", path, b"", int(time.time() * 1000))
        return httpx.get(api.url + path, headers=headers)

    twice = get("/v1/tasks?type=idle&status=active&status=paused")
    assert twice.status_code == 422, twice.text
    assert "status: given more than once" in twice.json()["detail"]
    tag = unique("lbl")
    client.create_task("idle", EVERY_HOUR, None, tag, labels={"a": "1", "b": "2"})
    both = get("/v1/tasks?type=idle&label=a%3D1&label=b%3D2")
    assert both.status_code == 200 and [t["task_id"] for t in both.json()["tasks"]] == [tag]


def test_bulk_create_is_all_or_nothing_on_invalid_input_and_reports_each_task(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    tag = unique("bulk")
    tasks = [
        {"type": "idle", "schedule": EVERY_HOUR, "task_id": f"{tag}-{i}", "payload": {"i": i}}
        for i in range(2000)
    ]
    broken = [*tasks[:5], {"type": "idle", "schedule": {"kind": "weekly"}}, *tasks[5:10]]
    with pytest.raises(ApiError) as refused:
        client.create_tasks(broken)
    assert refused.value.status == 422
    assert refused.value.errors[0]["field"].startswith("tasks[5]")
    assert not any(stored.exists(db, keys, f"{tag}-{i}") for i in range(10))

    result = client.create_tasks(tasks)
    assert (result["created"], result["existing"], result["conflicts"]) == (2000, 0, 0)
    assert all(stored.exists(db, keys, f"{tag}-{i}") for i in (0, 999, 1999))

    again = [*tasks[:3], {**tasks[3], "payload": {"i": "changed"}}]
    result = client.create_tasks(again)
    assert (result["created"], result["existing"], result["conflicts"]) == (0, 3, 1)
    assert result["results"][3] == {"task_id": f"{tag}-3", "created": False, "conflict": True}
    assert stored.payload(db, keys, f"{tag}-3") == {"i": 3}


def test_bulk_create_refuses_more_than_max_bulk_and_a_body_over_the_limit(
    api: ApiNode, client: Client
) -> None:
    with pytest.raises(ApiError) as refused:
        client.create_tasks([])
    assert refused.value.status == 422
    response = _raw_post(api, client, "/v1/tasks/bulk", b"[" + b" " * 1_100_000 + b"]")
    assert response.status_code == 413
    assert response.json()["code"] == "too_large"
    # Refused before reading, so before authentication too: an unsigned flood costs nothing.
    unsigned = httpx.post(api.url + "/v1/tasks/bulk", content=b"x" * 1_100_000)
    assert unsigned.status_code == 413


def test_list_filters_by_type_and_status_and_pages_with_a_cursor(client: Client) -> None:
    tag = unique("page")
    client.create_tasks(
        [{"type": "idle", "schedule": EVERY_HOUR, "task_id": f"{tag}-{i}"} for i in range(25)]
    )
    for i in range(5):
        client.pause(f"{tag}-{i}")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = client.list_tasks("idle", "paused", cursor, 2)
        seen += [t["task_id"] for t in page["tasks"]]
        assert all(t["status"] == "paused" for t in page["tasks"])
        cursor = page["next_cursor"]
        pages += 1
        if cursor is None:
            break
    assert sorted(t for t in seen if t.startswith(tag)) == sorted(f"{tag}-{i}" for i in range(5))
    assert pages >= 3
    everything = [t["task_id"] for t in client.iter_tasks("idle")]
    assert {f"{tag}-{i}" for i in range(25)} <= set(everything)
    assert len(everything) == len(set(everything))
    in_small_pages = [t["task_id"] for t in client.iter_tasks("idle", limit=7)]  # page size
    assert sorted(in_small_pages) == sorted(everything)
    bad_queries = [
        ({"limit": "0"}, "limit"),
        ({"status": "sleeping"}, "status"),
        ({"cursor": "nonsense"}, "cursor"),
        ({"colour": "red"}, "colour"),
    ]
    for params, field in bad_queries:
        with pytest.raises(ApiError) as refused:
            client.request("GET", "/v1/tasks", params=params)
        assert refused.value.status == 422
        assert refused.value.errors[0]["field"] == field


# -- change ---------------------------------------------------------------------------


def test_update_pause_resume_stop_and_delete(client: Client, db: redis.Redis, keys: Keys) -> None:
    task_id = unique("life")
    client.create_task("idle", EVERY_HOUR, {"v": 1}, task_id)
    assert client.update_task(task_id, payload={"v": 2})["status"] == "active"
    client.update_task(task_id, schedule={"kind": "interval", "every_s": 7200, "start_ms": LATER})
    task = client.get_task(task_id)
    assert task["payload"] == {"v": 2} and task["schedule"]["every_s"] == 7200.0
    score = db.zscore(keys.schedule(keys.partition_of(task_id)), task_id)
    assert score == task["next_run_ms"]

    with pytest.raises(ApiError) as refused:
        client.update_task(task_id, colour="red")
    assert refused.value.status == 422 and refused.value.errors[0]["field"] == "colour"
    with pytest.raises(ApiError) as refused:
        client.update_task(task_id)
    assert refused.value.status == 422

    assert client.pause(task_id)["status"] == "paused"
    assert db.zscore(keys.schedule(keys.partition_of(task_id)), task_id) is None
    assert client.resume(task_id)["status"] == "active"
    assert client.stop(task_id)["status"] == "stopped"
    with pytest.raises(ApiError) as refused:
        client.resume(task_id)
    assert (refused.value.status, refused.value.code) == (409, "invalid_transition")

    assert client.delete_task(task_id) == {"task_id": task_id, "deleted": True}
    assert not stored.exists(db, keys, task_id)
    for call in (client.get_task, client.delete_task, client.pause, client.explain):
        with pytest.raises(ApiError) as refused:
            call(task_id)
        assert refused.value.status == 404


def test_pause_and_resume_keep_a_note_that_get_and_explain_show(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    task_id = unique("noted")
    client.create_task("idle", EVERY_HOUR, None, task_id)
    assert client.get_task(task_id)["note"] is None
    assert client.pause(task_id, note="vendor outage, see INC-42")["status"] == "paused"
    note = client.get_task(task_id)["note"]
    assert (note["note"], note["action"], note["by"]) == ("vendor outage, see INC-42", "pause",
                                                          ADMIN[0])  # fmt: skip
    assert json.loads(db.hget(keys.notes(keys.partition_of(task_id)), task_id) or "") == note
    facts = client.explain(task_id)
    assert facts["note"] == note
    assert facts["summary"][1].endswith(f"by key {ADMIN[0]}: vendor outage, see INC-42")
    assert all("note" not in t for t in client.list_tasks("idle", "paused")["tasks"])

    # Refused whole: nothing changes, the field is named.
    path = f"/v1/tasks/{task_id}/resume"
    for body, field in (({"note": "x" * 501}, "note"), ({"note": 7}, "note"),
                        ({"note": "   "}, "note"), ({"note": "ok", "by": "me"}, "by"),
                        (["note"], "body")):  # fmt: skip
        with pytest.raises(ApiError) as refused:
            client.request("POST", path, body=body)
        assert refused.value.status == 422 and refused.value.errors[0]["field"] == field, body
    assert client.get_task(task_id)["status"] == "paused"
    assert client.get_task(task_id)["note"] == note

    # An empty body, {} or a null note: the change alone, which removes the earlier note.
    assert client.request("POST", path, body={"note": None})["status"] == "active"
    assert client.get_task(task_id)["note"] is None
    assert client.request("POST", f"/v1/tasks/{task_id}/pause", body={})["status"] == "paused"
    assert client.resume(task_id, note="back")["status"] == "active"
    assert client.get_task(task_id)["note"]["action"] == "resume"

    # A stop keeps no note: one given is refused, not dropped; {} is no body.
    with pytest.raises(ApiError) as refused:
        client.request("POST", f"/v1/tasks/{task_id}/stop", body={"note": "retired"})
    assert refused.value.status == 422 and refused.value.errors[0]["field"] == "body"
    assert client.get_task(task_id)["status"] == "active"
    assert client.request("POST", f"/v1/tasks/{task_id}/stop", body={})["status"] == "stopped"
    client.delete_task(task_id)
    assert db.hget(keys.notes(keys.partition_of(task_id)), task_id) is None


def test_concurrent_updates_to_one_task_leave_it_consistent(
    client: Client, api: ApiNode, db: redis.Redis, keys: Keys
) -> None:
    task_id = unique("race")
    client.create_task("idle", EVERY_HOUR, {"writer": -1}, task_id)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with Client(api.url, *ADMIN) as mine:
                for i in range(10):
                    every = 60 * (n + 1) + i
                    mine.update_task(
                        task_id,
                        payload={"writer": n, "i": i},
                        schedule={"kind": "interval", "every_s": every, "start_ms": LATER},
                    )
                    (mine.pause if i % 2 else mine.resume)(task_id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    task = client.get_task(task_id)
    assert task["payload"]["writer"] in range(6)
    # Whatever order the writes landed in, the index agrees with the hash.
    score = db.zscore(keys.schedule(keys.partition_of(task_id)), task_id)
    if task["status"] == "active":
        assert score == task["next_run_ms"]
    else:
        assert task["status"] == "paused" and score is None


def test_trigger_runs_the_task_once_now_without_moving_its_schedule(
    client: Client, record_file: Path
) -> None:
    task_id = unique("now")
    client.create_task("work", EVERY_HOUR,
                       {"x": 1}, task_id)  # fmt: skip
    before = client.get_task(task_id)["next_run_ms"]
    triggered = client.trigger(task_id)
    assert triggered["schedule_id"].startswith(f"{task_id}:")
    ran = wait_until(lambda: records(record_file, task_id))
    assert [r["schedule_id"] for r in ran] == [triggered["schedule_id"]]
    assert client.get_task(task_id)["next_run_ms"] == before


def test_clear_needs_the_type_repeated(client: Client, db: redis.Redis, keys: Keys) -> None:
    kind = unique("scratch").replace("-", "x")
    tasks = [{"type": kind, "schedule": EVERY_HOUR, "task_id": f"{kind}-{i}"} for i in range(30)]
    # "scratch" types are not declared by this node's [api] task_types: declared types only.
    with pytest.raises(ApiError) as refused:
        client.create_tasks(tasks)
    assert "unknown task type" in refused.value.detail
    client.create_tasks([{**t, "type": "idle"} for t in tasks])
    with pytest.raises(ApiError) as refused:
        client.request("POST", "/v1/types/idle/clear", body={"confirm": "idl"})
    assert refused.value.status == 422 and refused.value.errors[0]["field"] == "confirm"
    assert stored.exists(db, keys, f"{kind}-0")
    deleted = client.clear_type("idle")["deleted"]
    assert deleted >= 30
    assert not any(stored.exists(db, keys, f"{kind}-{i}") for i in range(30))


# -- explain, queues, dead letters ----------------------------------------------------


def test_explain_says_why_a_task_is_or_is_not_running(client: Client, record_file: Path) -> None:
    paused = unique("why")
    client.create_task("idle", EVERY_HOUR, None, paused)
    client.pause(paused)
    facts = client.explain(paused)
    assert facts["status"] == "paused" and facts["in_schedule_index"] is False
    assert facts["summary"][0].startswith("paused")

    waiting = unique("why")
    client.create_task("flaky", {"kind": "once", "at_ms": int(time.time() * 1000)}, None, waiting)
    # The retry context and the task's last outcome are separate writes: wait for both.
    facts = wait_until(
        lambda: (f := client.explain(waiting))["retries"] and f["last_status"] == "retry" and f
    )
    (retry,) = facts["retries"]
    assert retry["attempt"] == 1 and "boom on attempt 0" in retry["last_error"]
    # attempt 1, as its ctx.attempt and the retried line's next_attempt say
    (said,) = [line for line in facts["summary"] if "waits for retry attempt 1 at" in line]
    assert said.endswith("after: RuntimeError: boom on attempt 0"), said  # its line alone
    assert "boom on attempt 0" in facts["last_error"]
    assert client.queues("flaky")["retrying"] >= 1  # counted per type from retry contexts

    dead = unique("why")
    client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None, dead)
    facts = wait_until(lambda: (f := client.explain(dead))["dead_letters"]["count"] and f)
    assert facts["dead_letters"]["newest"]["reason"] == "unrecoverable"
    assert any("dead letter" in line for line in facts["summary"])


def test_explain_says_which_fires_were_not_run_and_why(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    """The not-run record as the fire path stores it (count, reason, due, blocking due)."""
    task_id = unique("skipped")
    client.create_task("idle", EVERY_HOUR, None, task_id)
    assert client.explain(task_id)["not_run"] is None
    record = keys.not_run(keys.partition_of(task_id))
    db.hset(record, task_id, "2 overlap 1796299200000 1796299140000")
    facts = client.explain(task_id)
    assert facts["not_run"] == {"count": 2, "reason": "overlap", "due_ms": 1796299200000,
                                "blocking_due_ms": 1796299140000}  # fmt: skip
    assert facts["summary"][1] == (
        "2 fires not run: the last, due 2026-12-03T12:00:00Z, was skipped (overlap) while "
        "the fire due 11:59:00Z was still in flight"
    )
    db.hset(record, task_id, "1 expired 1796299200000 -")
    facts = client.explain(task_id)
    assert facts["not_run"]["blocking_due_ms"] is None
    assert "(expired: later than its catch-up window)" in facts["summary"][1]
    for bad in ("", "two overlap 1796299200000 -", "3 overlap", "1 expired 1 - more"):
        db.hset(record, task_id, bad)
        facts = client.explain(task_id)
        assert facts["not_run"] == {"unreadable": bad}
        assert "not-run record is stored but cannot be read" in facts["summary"][1]


def test_explain_and_queues_show_a_running_fire_and_the_one_queued_behind_it(
    client: Client,
) -> None:
    now = int(time.time() * 1000)
    running, waiting = unique("busy"), unique("busy")
    # One handler slot: the first fire runs for 3 s, the second waits in the stream.
    client.create_task("slow", {"kind": "once", "at_ms": now}, {"sleep_s": 3}, running)
    wait_until(lambda: client.explain(running)["stream"])
    client.create_task("slow", {"kind": "once", "at_ms": now}, {"sleep_s": 0}, waiting)
    facts = wait_until(lambda: (f := client.explain(running))["stream"][0]["delivered"] and f)
    (msg,) = facts["stream"]
    assert msg["consumer"].startswith("api-node") and msg["deliveries"] == 1
    assert any("is running on consumer" in line for line in facts["summary"])
    queued = wait_until(lambda: (f := client.explain(waiting))["stream"] and f)
    assert queued["stream"][0]["delivered"] is False
    assert any("is queued, waiting" in line for line in queued["summary"])
    stats = client.queues("slow")
    assert stats["pending"] == 1 and stats["length"] == 2 and stats["undelivered"] == 1
    assert stats["oldest_pending_age_ms"] >= 0
    assert stats["consumers"][0]["pending"] == 1
    # Both drain: the stream empties and explain says when each ran.
    wait_until(lambda: not client.explain(waiting)["stream"], timeout_s=20)
    assert client.explain(running)["summary"][-1].startswith("last run at")


def test_queues_show_backlog_consumers_retries_and_dead_letters(client: Client) -> None:
    task_id = unique("q")
    client.create_task("doomed", {"kind": "once", "at_ms": int(time.time() * 1000)}, None, task_id)
    client.create_task("idle", EVERY_HOUR, None, unique("q"))
    wait_until(lambda: client.explain(task_id)["dead_letters"]["count"])
    stats = client.queues()
    by_type = {q["type"]: q for q in stats["queues"]}
    assert {"doomed", "idle"} <= set(by_type)  # every type with tasks, consumed here or not
    assert by_type["idle"]["consumers"] == [] and by_type["idle"]["length"] == 0
    doomed = by_type["doomed"]
    assert doomed["dead_letters"] >= 1
    assert [c["name"].startswith("api-node") for c in doomed["consumers"]] == [True]
    one = client.queues("doomed")
    assert one["type"] == "doomed" and one["dead_letters"] == doomed["dead_letters"]


def create_doomed(client: Client, ids: list[str]) -> None:
    """Tasks of the always-failing type, due now: each fire goes to the dead-letter queue."""
    now = int(time.time() * 1000)
    schedule = {"kind": "once", "at_ms": now}
    client.create_tasks([{"type": "doomed", "schedule": schedule, "task_id": i} for i in ids])


def test_dead_letters_list_show_replay_and_purge(
    client: Client, db: redis.Redis, keys: Keys, record_file: Path
) -> None:
    ids = [unique("dlq") for _ in range(3)]
    create_doomed(client, ids)

    def entries() -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        before = None
        while True:
            page = client.dead_letters("doomed", before, 2)
            for d in page["dead_letters"]:
                if d["task_id"] in ids:
                    found.setdefault(d["task_id"], d)
            before = page["next_cursor"]
            if before is None:
                return found

    dead = wait_until(lambda: len(e := entries()) == 3 and e)
    first = dead[ids[0]]
    assert "never going to work" in client.dead_letter("doomed", first["entry_id"])["error"]

    # The same entry named twice (the second with a leading zero) is replayed once, and
    # said replayed, not missing.
    again = "0" + first["entry_id"]
    replayed = client.replay("doomed", [first["entry_id"], "1-1", again])
    assert (replayed["replayed"], replayed["missing"]) == (1, 1), replayed
    assert not db.xrange(keys.dlq("doomed"), first["entry_id"], first["entry_id"])
    # It ran again (and, hopeless as it is, died again: a new dead letter).
    wait_until(lambda: len(records(record_file, ids[0])) == 2)
    with pytest.raises(ApiError) as refused:
        client.dead_letter("doomed", first["entry_id"])
    assert refused.value.status == 404

    second = dead[ids[1]]
    assert client.purge("doomed", [second["entry_id"]])["purged"] == 1
    with pytest.raises(ApiError) as refused:
        client.request("POST", "/v1/dlq/doomed/purge", body={"all": True})
    assert refused.value.status == 422
    assert db.xlen(keys.dlq("doomed")) >= 1
    client.purge("doomed")
    assert db.xlen(keys.dlq("doomed")) == 0


def test_dead_letters_a_consumer_would_not_read_stay_and_are_said_malformed(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    """Dead letters another program wrote with the fields of a message but values no
    consumer reads (a payload that is not JSON, a due time that is no whole number in
    range): a replay leaves them in the DLQ, counted malformed, rather than moving them
    to come back at once as new dead letters; the readable one moves."""
    kind = unique("foreign")
    dlq = keys.dlq(kind)
    bad = [
        db.xadd(dlq, {"task_id": "t", "payload": "not json", "due_ms": "1000"}),
        db.xadd(dlq, {"task_id": "t", "payload": "{}", "due_ms": "abc"}),
        db.xadd(dlq, {"task_id": "t", "payload": "{}", "due_ms": "-5"}),
        db.xadd(dlq, {"task_id": "t", "payload": "{}", "due_ms": "9" * 20}),
    ]
    good = db.xadd(dlq, {"task_id": "t", "payload": '{"n":1}', "due_ms": "1000"})
    result = client.replay(kind)
    assert (result["replayed"], result["malformed"]) == (1, 4), result
    left = [entry_id for entry_id, _ in db.xrange(dlq) or []]
    assert left == bad and good not in left
    assert db.xlen(keys.queue(kind)) == 1


def test_replay_all_moves_every_dead_letter_back(
    client: Client, db: redis.Redis, keys: Keys, record_file: Path
) -> None:
    ids = [unique("all") for _ in range(4)]
    create_doomed(client, ids)
    wait_until(lambda: all(client.explain(i)["dead_letters"]["count"] for i in ids))
    present = db.xlen(keys.dlq("doomed"))
    result = client.replay("doomed")
    assert result["replayed"] == present
    # Each ran a second time (the replay), and failed into the DLQ once more.
    wait_until(lambda: all(len(records(record_file, i)) == 2 for i in ids))
    wait_until(lambda: all(client.explain(i)["dead_letters"]["count"] == 1 for i in ids))


# -- probes and routing -----------------------------------------------------------------


def test_health_readiness_and_openapi_are_open(api: ApiNode) -> None:
    assert httpx.get(api.url + "/healthz").json() == {"status": "ok", "version": __version__}
    ready = httpx.get(api.url + "/readyz")
    assert ready.status_code == 200
    # the version as /healthz has it; no actor paths unsigned
    assert ready.json() == {"ready": True, "redis": True, "version": __version__}
    document = httpx.get(api.url + "/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert "/v1/tasks/{task_id}/explain" in document["paths"]


def test_unknown_routes_and_methods_are_problem_details(api: ApiNode, client: Client) -> None:
    missing = httpx.get(api.url + "/v2/everything")
    assert missing.status_code == 404 and missing.json()["code"] == "no_route"
    wrong = httpx.put(api.url + "/v1/tasks")
    assert wrong.status_code == 405
    assert wrong.headers["content-type"] == "application/problem+json"


def test_read_only_key_reads_but_cannot_write(api: ApiNode, db: redis.Redis, keys: Keys) -> None:
    task_id = unique("ro")
    with Client(api.url, *READER) as reader:
        assert "queues" in reader.queues()
        with pytest.raises(ApiError) as refused:
            reader.create_task("idle", EVERY_HOUR, None, task_id)
    assert (refused.value.status, refused.value.code) == (403, "read_only")
    assert not stored.exists(db, keys, task_id)
