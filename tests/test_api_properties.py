"""Property: whatever a client sends as a task, the API answers 2xx or 4xx, never 5xx, and a
refusal writes nothing while an acceptance writes a whole task.

Hypothesis draws task bodies, schedules and updates from a space that mixes valid values
with every kind of wrong one (out-of-range and huge numbers, NaN, wrong types, unknown
keys, bad names, cron strings, time zones); each is sent to a real node, and Redis is
checked afterwards. The node fixture fails the module if any request was answered 500.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from actors.admin.client import ApiError, Client
from actors.store.keys import Keys
from tests import stored
from tests.api_node import ADMIN, ApiNode, plain_api_node

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CRONS = ["0 9 * * 1-5", "*/5 * * * *", "0 0 * * * *", "61 * * * *", "@daily", ""]
CRONS = ["0 9 * * 1-5", "*/5 * * * *", "0 0 * * * *", "61 * * * *", "@daily", ""]
FAR_FUTURE = 4102444800000  # 2100: accepted tasks must not fill a stream while we look

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 0.5, 60, 3600, 1e12, 1e308, 2**53, 2**64, -1]),
)
json_scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
names = st.one_of(
    st.sampled_from(["work", "report", "a", "x" * 64, "x" * 65, "bad type", "a/b", "", "-x"]),
    st.text(max_size=70),
)
#: Schedules that should be accepted, so that acceptances are explored as much as refusals.
valid_schedules = st.one_of(
    st.fixed_dictionaries(
        {
            "kind": st.just("interval"),
            "every_s": st.floats(1, 1e6),
            "start_ms": st.just(FAR_FUTURE),
        },
        optional={"jitter_s": st.floats(0, 60), "max_runs": st.integers(1, 10**6)},
    ),
    st.fixed_dictionaries(
        {"kind": st.just("cron"), "cron": st.sampled_from(CRONS[:2])},
        optional={"tz": st.sampled_from(["UTC", "Europe/Paris", "America/New_York"])},
    ),
    st.fixed_dictionaries(
        {"kind": st.just("once"), "at_ms": st.integers(FAR_FUTURE, 2 * FAR_FUTURE)}
    ),
)
valid_bodies = st.fixed_dictionaries(
    {"type": st.sampled_from(["work", "report"]), "schedule": valid_schedules},
    optional={"payload": st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=20)),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )},
)  # fmt: skip
wild_schedules = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.sampled_from(["interval", "cron", "once", "weekly"])},
        optional={
            "every_s": numbers,
            "cron": st.one_of(st.sampled_from(CRONS), st.text(max_size=20)),
            "tz": st.sampled_from(["UTC", "Europe/Paris", "Mars/Olympus", "", "../etc"]),
            "at_ms": numbers,
            "start_ms": st.one_of(st.just(FAR_FUTURE), numbers),
            "end_ms": numbers,
            "max_runs": numbers,
            "jitter_s": numbers,
            "misfire": st.sampled_from(["coalesce", "skip", "fire_all", "later"]),
            "misfire_cap": numbers,
            "colour": json_scalars,
        },
    ),
    json_values,
)
schedules = st.one_of(valid_schedules, wild_schedules)
bodies = st.one_of(
    valid_bodies,
    st.fixed_dictionaries(
        {"type": st.one_of(st.just("work"), names), "schedule": schedules},
        optional={"payload": json_values, "task_id": names, "extra": json_scalars},
    ),
)


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    with plain_api_node(redis_url, tmp_path_factory.mktemp("prop"), "prop") as node:
        yield node


@pytest.fixture(scope="module")
def client(api: ApiNode) -> Iterator[Client]:
    with Client(api.url, *ADMIN) as c:
        yield c


@pytest.fixture(scope="module")
def keys(api: ApiNode) -> Keys:
    return Keys(api.namespace, 16)


_counter = iter(range(10**9))


def fresh_id() -> str:
    return f"p{time.monotonic_ns()}-{next(_counter)}"


def whole_or_absent(db: redis.Redis, keys: Keys, client: Client, task_id: str) -> bool:
    """Both records or neither (no half-written task); True when the task exists, and then
    the API can read and explain it."""
    partition, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
    has_definition = db.hexists(keys.definitions(partition, bucket), task_id)
    has_state = db.hexists(keys.states(partition, bucket), task_id)
    assert has_definition == has_state, (task_id, has_definition, has_state)
    if has_definition:
        assert client.get_task(task_id)["task_id"] == task_id
        assert client.explain(task_id)["summary"]
    return bool(has_definition)


def send(client: Client, method: str, path: str, body: Any) -> tuple[int, Any]:
    try:
        answer = client.request(method, path, body=body)
        event(f"{method} answered 2xx")
        return 200, answer
    except ApiError as refused:
        error = refused
    event(f"{method} answered {error.status}")
    assert 400 <= error.status < 500, (error.status, error.detail, body)
    return error.status, error


def _is_name(value: Any) -> bool:
    from runtime.config import check_name

    try:
        check_name("task_id", value, 128)
    except ValueError:
        return False
    return True


@PROPERTY
@given(body=bodies, own_id=st.booleans())
def test_any_create_is_2xx_or_4xx_and_writes_a_whole_task_or_nothing(
    client: Client, db: redis.Redis, keys: Keys, body: dict[str, Any], own_id: bool
) -> None:
    if own_id or "task_id" not in body:
        body = {**body, "task_id": fresh_id()}
    task_id = body["task_id"]
    # A drawn id like "a" may have been created by an earlier example.
    existed = _is_name(task_id) and whole_or_absent(db, keys, client, task_id)
    status, answer = send(client, "POST", "/v1/tasks", body)
    if status == 200:
        assert answer["task_id"] == task_id
        assert whole_or_absent(db, keys, client, task_id)
    elif _is_name(task_id):
        assert whole_or_absent(db, keys, client, task_id) == existed


@PROPERTY
@given(items=st.lists(bodies, min_size=1, max_size=4))
def test_any_bulk_create_is_all_or_nothing(
    client: Client, db: redis.Redis, keys: Keys, items: list[dict[str, Any]]
) -> None:
    items = [{**item, "task_id": fresh_id()} for item in items]
    status, _answer = send(client, "POST", "/v1/tasks/bulk", {"tasks": items})
    present = [whole_or_absent(db, keys, client, item["task_id"]) for item in items]
    assert all(present) if status == 200 else not any(present)


@PROPERTY
@given(change=st.fixed_dictionaries({}, optional={"schedule": schedules, "payload": json_values,
                                                  "status": json_scalars}))  # fmt: skip
def test_any_update_is_2xx_or_4xx_and_a_refusal_changes_nothing(
    client: Client, db: redis.Redis, keys: Keys, change: dict[str, Any]
) -> None:
    task_id = fresh_id()
    schedule = {"kind": "interval", "every_s": 3600, "start_ms": FAR_FUTURE}
    client.create_task("work", schedule, {"v": 1}, task_id)
    before = client.get_task(task_id)
    status, _answer = send(client, "PATCH", f"/v1/tasks/{task_id}", change)
    assert whole_or_absent(db, keys, client, task_id)
    after = client.get_task(task_id)
    if status != 200:
        assert (after["schedule"], after["payload"]) == (before["schedule"], before["payload"])
    assert stored.exists(db, keys, task_id)
