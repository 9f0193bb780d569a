"""Records in Redis this version cannot read (another program's, an older version's, bytes
mangled): every read that meets one answers with an error naming it, or goes on past it
and names it; none answers a bare 500, and no actor crash-loops on one. A real node, a
real Redis; the records are written as such a writer would."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import msgpack
import pytest
import redis

from actors.admin.client import ApiError, Client
from actors.api.signing import sign
from actors.domain.api_keys import ApiKey
from actors.store.keys import Keys
from tests.api_node import ADMIN, ApiNode, cli_environment, recording_api_node, unique, wait_until
from tests.cli_runner import run_in_process

EVERY_HOUR = {"kind": "interval", "every_s": 3600, "start_ms": 4102444800000}
ACTIONS = "[actions]\nresume_interval_s = 0.2\n"


@pytest.fixture(scope="module")
def api(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, record_file: Path
) -> Iterator[ApiNode]:
    with recording_api_node(
        redis_url, tmp_path_factory.mktemp("api"), "unread", record_file, consumers=ACTIONS
    ) as node:
        yield node


def _create(client: Client, kind: str, count: int) -> list[str]:
    ids = [unique("t") for _ in range(count)]
    for task_id in ids:
        client.create_task(kind, EVERY_HOUR, {"n": 1}, task_id)
    return ids


def test_a_task_whose_records_cannot_be_read_is_named_and_listings_and_actions_go_past_it(
    api: ApiNode, client: Client, db: redis.Redis, keys: Keys
) -> None:
    kind = unique("kind")
    ids = _create(client, kind, 4)
    bad, odd = ids[1], ids[3]
    definitions = keys.definitions(keys.partition_of(bad), keys.bucket_of(bad))
    db.hset(definitions, bad, b"\xc1\xc1\xc1")
    # A state record that decodes but holds text where a time goes (next_ms).
    states = keys.states(keys.partition_of(odd), keys.bucket_of(odd))
    state = db.hget(states, odd)
    assert isinstance(state, bytes)
    db.hset(states, odd, state[:1] + b"\xa4soon" + state[10:])  # next_ms: a uint64 before

    for task_id, record in ((bad, "definition"), (odd, "state")):
        for read in (client.get_task, client.explain):
            with pytest.raises(ApiError) as failed:
                read(task_id)
            assert failed.value.status == 500 and failed.value.code == "unreadable_record"
            assert f"task {task_id!r}: its {record} record" in failed.value.detail
    with pytest.raises(ApiError) as failed:
        client.get_task(bad)
    assert "not MessagePack" in failed.value.detail and "\\xc1" not in failed.value.detail

    page = client.list_tasks(kind)
    assert sorted(t["task_id"] for t in page["tasks"]) == sorted([ids[0], ids[2]])
    named = {u["task_id"]: u["error"] for u in page["unreadable"]}
    assert sorted(named) == sorted([bad, odd]) and "not a whole number" in named[odd]
    listed = run_in_process(["tasks", "ls", "--type", kind, "--all"], cli_environment(api))
    assert listed.returncode == 0, listed.stderr
    assert f"unreadable: {bad}: " in listed.stdout and ids[0] in listed.stdout

    # An action over the type changes the others and leaves the broken ones as they are.
    done = client.tasks_action("pause", {"type": kind})
    assert (done["changed"], done["failed_count"]) == (2, 0), done
    assert {client.get_task(t)["status"] for t in (ids[0], ids[2])} == {"paused"}
    assert db.hget(definitions, bad) == b"\xc1\xc1\xc1"

    def said() -> set[str]:
        return {e["task_id"] for e in api.node.events("task_unreadable") if e["level"] == "error"}

    wait_until(lambda: {bad, odd} <= said(), 30)

    # Deleting them still works, a labels record no script reads too: the way out for an
    # operator who cannot mend them.
    db.hset(keys.labels(keys.partition_of(bad)), bad, "not JSON")
    for task_id in (bad, odd):
        assert client.delete_task(task_id)["deleted"] is True
    assert db.hget(definitions, bad) is None


def test_values_json_has_no_form_for_are_shown_by_name(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    (task_id,) = _create(client, unique("kind"), 1)
    p, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
    definition = db.hget(keys.definitions(p, bucket), task_id)
    # The payload as a MessagePack str: its header holds its length (7, then 9).
    assert isinstance(definition, bytes) and b'\xa7{"n":1}' in definition
    nan = definition.replace(b'\xa7{"n":1}', b'\xa9{"n":NaN}')
    db.hset(keys.definitions(p, bucket), task_id, nan)
    db.hset(keys.labels(p), task_id, '{"team":"\\ud800"}')  # a lone surrogate, escaped
    db.hset(keys.notes(p), task_id, json.dumps({"note": "x", "at_ms": float("inf")}))
    process = unique("ghost")
    db.hset(keys.nodes, process, json.dumps({"process": process, "seen_ms": 1e400}))

    shown = client.get_task(task_id)
    assert shown["payload"] == {"n": "NaN"} and shown["labels"] == {"team": "\ud800"}
    facts = client.explain(task_id)
    assert facts["note"] == {"note": "x", "at_ms": "Infinity"}
    listed = client.list_tasks(client.get_task(task_id)["type"])["tasks"]
    assert [t["payload"] for t in listed] == [{"n": "NaN"}]
    assert process not in [n.get("process") for n in client.nodes()["processes"]]  # dropped
    assert db.hget(keys.nodes, process) is None


def test_json_nested_past_the_decoders_depth_is_named_or_shown(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    """A payload, a note or an acknowledgement another program stored as JSON nested
    deeper than the decoder follows: the task is named unreadable (a read answers so, a
    listing goes past it, an action leaves it as it is), the note and acknowledgement are
    shown as unreadable; a NaN nested hundreds deep is shown by name."""
    kind = unique("kind")
    deep, nan, fine = _create(client, kind, 3)

    def with_payload(task_id: str, payload: str) -> None:
        p, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
        stored = db.hget(keys.definitions(p, bucket), task_id)
        assert isinstance(stored, bytes)
        kind_, _, schedule, created = msgpack.Unpacker(io.BytesIO(stored), raw=True)
        record = b"".join(msgpack.packb(v) for v in (kind_, payload.encode(), schedule, created))
        db.hset(keys.definitions(p, bucket), task_id, record)

    with_payload(deep, "[" * 5000 + "]" * 5000)
    with_payload(nan, "[" * 500 + "NaN" + "]" * 500)
    p = keys.partition_of(fine)
    db.hset(keys.notes(p), fine, "[" * 5000 + "]" * 5000)
    db.hset(keys.acks(p), fine, "[" * 5000 + "]" * 5000)

    with pytest.raises(ApiError) as failed:
        client.get_task(deep)
    assert failed.value.code == "unreadable_record", failed.value
    shown = client.get_task(nan)["payload"]
    for _ in range(500):
        (shown,) = shown
    assert shown == "NaN"
    facts = client.explain(fine)
    assert "unreadable" in facts["note"], facts["note"]
    page = client.list_tasks(kind)
    assert sorted(t["task_id"] for t in page["tasks"]) == sorted([nan, fine])
    assert [u["task_id"] for u in page["unreadable"]] == [deep]
    done = client.tasks_action("pause", {"type": kind})
    assert (done["changed"], done["failed_count"]) == (2, 0), done
    assert client.delete_task(deep)["deleted"] is True


def test_an_action_whose_record_cannot_be_read_is_named_and_the_resumer_goes_on(
    api: ApiNode, client: Client, db: redis.Redis, keys: Keys
) -> None:
    old, mangled, odd = unique("old"), unique("mangled"), unique("odd")
    # An action stored by a version whose selectors this one does not know, one whose
    # record is not JSON, and one whose lease end and holder no version wrote (text, and
    # bytes that are not UTF-8); all left open, their leases long run out.
    spec = {"action": "pause", "selector": {"kind": "old-style"}}
    db.hset(keys.action_record(old), mapping={"spec": json.dumps(spec), "state": "applying"})
    db.hset(keys.action_record(mangled), mapping={"spec": "{", "state": "applying"})
    fine = {"action": "pause", "selector": {"ids": [unique("none")]}}
    db.hset(keys.action_record(odd), mapping={
        "spec": json.dumps(fine), "state": "applying", "until": "soon", "holder": b"\xff",
    })  # fmt: skip

    for action_id in (old, mangled, odd):  # odd: its lease end is not a number
        with pytest.raises(ApiError) as failed:
            client.action_status(action_id)
        assert failed.value.status == 500 and failed.value.code == "unreadable_record"
        assert action_id in failed.value.detail
    with pytest.raises(ApiError) as failed:  # the same id asked again: named, not a conflict
        client.tasks_action("pause", {"ids": ["x"]}, action_id=mangled)
    assert failed.value.code == "unreadable_record"
    db.zadd(keys.actions_open, {old: 1, mangled: 2, odd: 3})  # now for the resumer to find

    def said() -> list[str]:
        return [e["action_id"] for e in api.node.events("action_unreadable")]

    wait_until(lambda: {old, mangled} <= set(said()), 30)
    # A lease end that is not a number counts as run out: taken (the take writes a lease
    # end and holder of its own), applied and finished.
    wait_until(lambda: client.action_status(odd)["done"], 30)
    crashed = [e for e in api.node.events("actor_crashed") if "action" in e.get("actor", "")]
    assert not crashed, crashed
    assert db.hget(keys.action_record(old), "spec") == json.dumps(spec).encode()  # kept

    # Mended, it is resumed at a later pass and finished; each was said once.
    db.hset(keys.action_record(mangled), "spec", json.dumps(fine))
    wait_until(lambda: client.action_status(mangled)["done"], 30)
    assert sorted(said()) == sorted([old, mangled])


def test_a_task_read_meeting_a_key_of_another_kind_names_it(
    client: Client, db: redis.Redis, keys: Keys
) -> None:
    """A key of a task's partition holding a string (another program's): each read of the
    task answers, or is refused as ``redis_rejected`` quoting Redis (``WRONGTYPE``)."""
    (task_id,) = _create(client, unique("kind"), 1)
    p = keys.partition_of(task_id)
    for key in (keys.not_run(p), keys.flights(p), keys.parked(p), keys.notes(p),
                keys.history(p), keys.retry(p)):  # fmt: skip
        kind = db.type(key)
        saved = db.dump(key) if kind != b"none" else None
        db.delete(key)
        db.set(key, "not a hash")
        try:
            for read in (client.explain, client.get_task, client.upcoming, client.history):
                refused = _refusal(read, task_id)  # answered, or refused naming Redis's reply
                assert refused is None or (
                    refused.code == "redis_rejected" and "WRONGTYPE" in refused.detail
                ), (key, read, refused)
        finally:
            db.delete(key)
            if saved is not None:
                db.restore(key, 0, saved)


def _refusal(read: Callable[[str], object], task_id: str) -> ApiError | None:
    try:
        read(task_id)
    except ApiError as refused:
        return refused
    return None


def test_values_another_program_left_in_shared_keys_leave_every_view_answering(
    api: ApiNode, client: Client, db: redis.Redis, keys: Keys
) -> None:
    """A lease end that is no number, a score of minus infinity, an attention count that
    is no number, a type and an open action named in bytes that are not UTF-8 (the action
    with an infinite lease end), a retry key of another kind: the partitions view, the queues view
    and ``/metrics`` answer, and the action resumer does not crash."""
    owner, schedule, counts = keys.partition_owner(0), keys.schedule(0), keys.attention_counts(0)
    saved_until = db.hget(owner, "until")
    ghost = unique("ghost")
    retry_kind = db.type(keys.retry(1))
    saved_retry = db.dump(keys.retry(1)) if retry_kind != b"none" else None
    try:
        db.hset(owner, "until", "soon")
        db.zadd(schedule, {ghost: float("-inf")})
        db.hset(counts, "idle failing", "many")
        db.sadd(keys.types, b"\xffodd")
        db.zadd(keys.actions_open, {b"\xffodd": float("-inf")})  # first in line
        db.delete(keys.retry(1))
        db.set(keys.retry(1), "not a zset")

        rows = client.partitions()["partitions"]
        assert rows[0]["lease_until_ms"] is None and rows[0]["next_due_ms"] == "-Infinity"
        assert any(q["type"] == "\ufffdodd" for q in client.queues()["queues"])
        signed = sign(ApiKey(ADMIN[0], ADMIN[1].encode()), "GET", "/metrics", b"",
                      int(time.time() * 1000))  # fmt: skip
        scraped = httpx.get(api.url + "/metrics", headers=signed, timeout=30)
        assert scraped.status_code == 200 and "metronome_redis_up 1.0" in scraped.text
        # An action after it in line is resumed: the resumer went past the odd one.
        after = unique("after")
        fine = {"action": "pause", "selector": {"ids": [unique("none")]}}
        db.hset(keys.action_record(after), mapping={"spec": json.dumps(fine), "state": "applying"})
        db.zadd(keys.actions_open, {after: 1})
        wait_until(lambda: client.action_status(after)["done"], 30)
        crashed = [e for e in api.node.events("actor_crashed") if "action" in e.get("actor", "")]
        assert not crashed, crashed
    finally:
        if saved_until is not None:
            db.hset(owner, "until", saved_until)
        db.zrem(schedule, ghost)
        db.hdel(counts, "idle failing")
        db.srem(keys.types, b"\xffodd")
        db.zrem(keys.actions_open, b"\xffodd")
        db.delete(keys.retry(1))
        if saved_retry is not None:
            db.restore(keys.retry(1), 0, saved_retry)
