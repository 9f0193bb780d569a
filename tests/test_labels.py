"""Labels on tasks and the listing's filters, against a real Redis (and a real node for the
API): what is in Redis afterwards is the judge, the label index above all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from actors.admin.client import ApiError, Client
from actors.domain.errors import InvalidTask
from actors.domain.model import TaskSpec, parse_spec, parse_specs
from actors.domain.schedules import Schedule
from actors.store.records import OUTCOME_NAMES
from actors.store.tasks import TaskStore
from runtime.redis_io import RedisClient
from tests.api_node import ApiNode, plain_api_node
from tests.test_store import namespace_keys

EVERY_MINUTE = Schedule("interval", every_s=60)
#: First fire in 2100.
LATER = 4102444800000
EVERY_HOUR = {"kind": "interval", "every_s": 3600, "start_ms": LATER}


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4, default_buckets=64)


async def indexed(store: TaskStore, key: str, value: str) -> set[str]:
    """Every task id the index of one label pair lists, over all partitions and buckets."""
    keys = await store.keys()
    found: set[str] = set()
    for p in range(keys.partitions):
        replies = await store.client.pipeline(
            [("HKEYS", keys.by_label(p, key, value, b)) for b in range(keys.buckets)]
        )
        found |= {m.decode() for reply in replies for m in reply}
    return found


async def stored_labels(store: TaskStore, task_id: str) -> bytes | None:
    keys = await store.keys()
    result: bytes | None = await store.client.execute(
        "HGET", keys.labels(keys.partition_of(task_id)), task_id
    )
    return result


async def every_page(store: TaskStore, **filters: Any) -> list[str]:
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page, cursor = await store.list_tasks(cursor=cursor, limit=7, **filters)
        seen += [t.task_id for t in page]
        pages += 1
        if cursor is None:
            return seen


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"tenant": 5}, "labels.tenant: must be a string"),
        ({"ten:ant": "a"}, "labels: the key 'ten:ant' must be"),
        ({"": "a"}, "labels: the key '' must be"),
        ({"tenant": "a{b}"}, "labels.tenant: 'a{b}' must be"),
        ({"tenant": "x" * 64}, "labels.tenant:"),
        ({"k" * 64: "a"}, "labels: the key 'kkkk"),
        ({f"k{i}": "v" for i in range(17)}, "labels: at most 16 labels, got 17"),
        (["tenant"], "labels: must be a JSON object, got list"),
        (None, "labels: must be a JSON object, got NoneType"),
    ],
)
def test_bad_labels_are_refused_naming_the_field(labels: Any, message: str) -> None:
    body = {"type": "t", "schedule": {"kind": "interval", "every_s": 60}, "labels": labels}
    with pytest.raises(InvalidTask, match="^" + message.replace("{", r"\{").replace("}", r"\}")):
        parse_spec(body)
    _, problems = parse_specs([body])
    assert problems and problems[0].startswith("[0]." + message.split(":")[0])


def test_good_labels_are_kept_and_the_fast_path_agrees() -> None:
    labels = {"tenant": "acme", "env": "", "tier.1": "gold-2_x"}
    body = {"type": "t", "schedule": {"kind": "interval", "every_s": 60}, "labels": labels}
    (fast,), problems = parse_specs([body])
    assert not problems and fast.labels == labels == parse_spec(body).labels
    assert fast.labels_json() == '{"env":"","tenant":"acme","tier.1":"gold-2_x"}'
    assert TaskSpec("t", EVERY_MINUTE).labels_json() == ""


async def test_a_refused_label_writes_nothing(store: TaskStore, namespace: str) -> None:
    await store.keys()
    before = await namespace_keys(store.client, namespace)
    with pytest.raises(InvalidTask):
        await store.create(TaskSpec("t", EVERY_MINUTE, labels={"a": "b:c"}))
    created = await store.create(TaskSpec("t", EVERY_MINUTE, task_id="x", labels={"a": "b"}))
    with pytest.raises(InvalidTask, match=r"^labels\.a: "):
        await store.update(created.task_id, labels={"a": "{x}"})
    task = await store.get("x")
    assert task is not None and task.labels == {"a": "b"}
    assert len(await namespace_keys(store.client, namespace)) > len(before)


# -- storage and the index ----------------------------------------------------------------


async def test_a_task_without_labels_stores_no_more(store: TaskStore, namespace: str) -> None:
    plain = await store.create(TaskSpec("t", EVERY_MINUTE, task_id="plain"))
    keys = await store.keys()
    names = await namespace_keys(store.client, namespace)
    assert not [n for n in names if ":label" in n]
    task = await store.get(plain.task_id)
    assert task is not None and task.labels == {} and task.to_dict()["labels"] == {}
    p, b = keys.partition_of("plain"), keys.bucket_of("plain")
    definition = await store.client.execute("HGET", keys.definitions(p, b), "plain")
    state = await store.client.execute("HGET", keys.states(p, b), "plain")
    # A labelled twin's records are byte for byte as long: labels live elsewhere.
    await store.create(TaskSpec("t", EVERY_MINUTE, task_id="plaim", labels={"a": "b"}))
    p2, b2 = keys.partition_of("plaim"), keys.bucket_of("plaim")
    assert len(await store.client.execute("HGET", keys.definitions(p2, b2), "plaim")) == len(
        definition
    )
    assert len(await store.client.execute("HGET", keys.states(p2, b2), "plaim")) == len(state)
    names = await namespace_keys(store.client, namespace)
    assert [n for n in names if ":label" in n] == sorted(
        [keys.labels(p2), keys.by_label(p2, "a", "b", b2)]
    )


async def test_create_update_delete_keep_the_index_exact(store: TaskStore, namespace: str) -> None:
    specs = [
        TaskSpec("t", EVERY_MINUTE, task_id=f"t{i}", labels={"tenant": f"c{i % 3}", "env": "p"})
        for i in range(30)
    ]
    await store.create_many(specs)
    assert await indexed(store, "tenant", "c0") == {f"t{i}" for i in range(0, 30, 3)}
    assert await indexed(store, "env", "p") == {f"t{i}" for i in range(30)}
    assert await stored_labels(store, "t1") == b'{"env":"p","tenant":"c1"}'

    # Idempotent create: same labels unchanged, other labels a conflict that changes nothing.
    (same,) = await store.create_many([specs[0]], raise_conflicts=False)
    assert not same.created and not same.conflict
    other = TaskSpec("t", EVERY_MINUTE, task_id="t0", labels={"tenant": "zz"})
    (clash,) = await store.create_many([other], raise_conflicts=False)
    assert clash.conflict and await indexed(store, "tenant", "zz") == set()

    await store.update("t0", labels={"tenant": "c9", "new": ""})
    assert "t0" not in await indexed(store, "tenant", "c0")
    assert "t0" not in await indexed(store, "env", "p")
    assert await indexed(store, "tenant", "c9") == {"t0"} == await indexed(store, "new", "")
    task = await store.get("t0")
    assert task is not None and task.labels == {"tenant": "c9", "new": ""}

    await store.update("t1", payload={"x": 1})  # labels absent: unchanged
    assert (await store.get("t1")).labels == {"env": "p", "tenant": "c1"}  # type: ignore[union-attr]

    await store.update("t2", labels={})  # all removed
    assert await stored_labels(store, "t2") is None
    assert "t2" not in await indexed(store, "env", "p")

    await store.delete("t3")
    await store.delete_many(["t4", "t5"])
    gone = {"t0", "t2", "t3", "t4", "t5"}
    assert await indexed(store, "env", "p") == {f"t{i}" for i in range(30)} - gone
    for deleted in ("t3", "t4", "t5"):
        assert await stored_labels(store, deleted) is None
    assert await store.clear_type("t") == 27
    names = await namespace_keys(store.client, namespace)
    assert not [n for n in names if ":label" in n]


# -- filters ------------------------------------------------------------------------------


async def test_filters_by_one_and_two_labels_across_pages(store: TaskStore) -> None:
    # Fixed ids: which buckets the tasks land in (so how pages split) is the same every run.
    tenants = ["acme", "umbrella", "initech"]
    specs = [
        TaskSpec("ab"[i % 2], EVERY_MINUTE, task_id=f"L{i}",
                 labels={"tenant": tenants[i % 3], "tier": "gold" if i % 5 == 0 else "std"})
        for i in range(400)
    ]  # fmt: skip
    await store.create_many(specs)
    acme = {s.task_id for s in specs if s.labels.get("tenant") == "acme"}
    seen = await every_page(store, labels={"tenant": "acme"})
    assert len(seen) == len(set(seen)) and set(seen) == acme
    gold_acme = {s.task_id for s in specs if s.labels == {"tenant": "acme", "tier": "gold"}}
    seen = await every_page(store, labels={"tenant": "acme", "tier": "gold"})
    assert len(seen) == len(set(seen)) and set(seen) == gold_acme and gold_acme
    seen = await every_page(store, labels={"tier": "gold", "tenant": "acme"}, task_type="a")
    assert set(seen) == {t for t in gold_acme if int(str(t)[1:]) % 2 == 0}
    assert await every_page(store, labels={"tenant": "nobody"}) == []
    await store.pause("L0")
    page, _ = await store.list_tasks(labels={"tenant": "acme"}, status="paused", limit=1000)
    assert [t.task_id for t in page] == ["L0"]


async def test_next_before_and_last_status(store: TaskStore) -> None:
    now = await store.now_ms()
    soon = Schedule("interval", every_s=60)
    late = Schedule("interval", every_s=60, start_ms=LATER)
    await store.create_many(
        [TaskSpec("t", soon, task_id=f"s{i}") for i in range(20)]
        + [TaskSpec("t", late, task_id=f"l{i}") for i in range(20)]
    )
    soon_ids = {f"s{i}" for i in range(20)}
    assert set(await every_page(store, next_before=now + 120_000)) == soon_ids
    assert set(await every_page(store, next_before=LATER)) == soon_ids | {
        f"l{i}" for i in range(20)
    }
    keys = await store.keys()
    for task_id, outcome in (("s1", "dead"), ("l2", "dead"), ("s3", "ok")):
        p, b = keys.partition_of(task_id), keys.bucket_of(task_id)
        run = b"".join(msgpack.packb(v) for v in (1, 0, now, OUTCOME_NAMES.index(outcome)))
        await store.client.execute("HSET", keys.runs(p, b), task_id, run)
    assert sorted(await every_page(store, last_status="dead")) == ["l2", "s1"]
    assert await every_page(store, last_status="dead", next_before=now + 120_000) == ["s1"]
    assert await every_page(store, last_status="ok") == ["s3"]
    for bad in ({"last_status": "fine"}, {"next_before": -1}, {"labels": {"a:b": "c"}}):
        with pytest.raises(InvalidTask):
            await store.list_tasks(**bad)


# -- the API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiNode]:
    with plain_api_node(redis_url, tmp_path_factory.mktemp("labels"), "labels") as node:
        yield node


def test_labels_through_the_api(api: ApiNode, client: Client) -> None:
    made = client.create_task("work", EVERY_HOUR, task_id="api-1", labels={"tenant": "acme"})
    assert made["created"]
    bulk = client.create_tasks(
        [{"type": "work", "schedule": EVERY_HOUR, "task_id": f"api-b{i}",
          "labels": {"tenant": "acme" if i % 2 else "other", "team": "x"}} for i in range(60)]
    )  # fmt: skip
    assert bulk["created"] == 60
    assert client.get_task("api-1")["labels"] == {"tenant": "acme"}
    assert client.explain("api-1")["labels"] == {"tenant": "acme"}
    listed = list(client.iter_tasks(labels={"tenant": "acme"}))
    assert {t["task_id"] for t in listed} == {"api-1"} | {f"api-b{i}" for i in range(1, 60, 2)}
    page = client.list_tasks(labels={"tenant": "acme", "team": "x"}, limit=5)
    ids = [t["task_id"] for t in page["tasks"]]
    cursor = page["next_cursor"]
    while cursor is not None:
        page = client.list_tasks(labels={"tenant": "acme", "team": "x"}, cursor=cursor, limit=5)
        ids += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
    assert sorted(ids) == sorted(f"api-b{i}" for i in range(1, 60, 2))

    client.update_task("api-1", labels={"tenant": "umbrella"})
    assert client.get_task("api-1")["labels"] == {"tenant": "umbrella"}
    assert "api-1" not in {t["task_id"] for t in client.iter_tasks(labels={"tenant": "acme"})}
    client.update_task("api-1", payload={"p": 1})
    assert client.get_task("api-1")["labels"] == {"tenant": "umbrella"}


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.create_task("work", EVERY_HOUR, labels={"bad:key": "v"}), "'bad:key'"),
        (
            lambda c: c.create_tasks(
                [{"type": "work", "schedule": EVERY_HOUR, "labels": {"t": 1}}]
            ),
            "tasks[0].labels.t",
        ),
        (lambda c: c.update_task("api-2", labels={"t": "{x}"}), "labels.t"),
        (lambda c: c.list_tasks(labels={"t": "a:b"}), "label"),
        (lambda c: c.list_tasks(last_status="fine"), "last_status"),
        (lambda c: c.request("GET", "/v1/tasks", params={"next_before": "soon"}), "next_before"),
        (lambda c: c.request("GET", "/v1/tasks", params={"label": "novalue"}), "label"),
    ],
)
def test_bad_labels_and_filters_are_422_and_write_nothing(
    api: ApiNode, client: Client, call: Any, field: str
) -> None:
    client.create_task("work", EVERY_HOUR, task_id="api-2", labels={"t": "a"})
    with pytest.raises(ApiError) as refused:
        call(client)
    assert refused.value.status == 422 and field in refused.value.detail
    assert client.get_task("api-2")["labels"] == {"t": "a"}
    assert [t["task_id"] for t in client.iter_tasks(labels={"t": "a"})] == ["api-2"]


async def test_a_type_created_or_deleted_mid_listing_repeats_and_skips_nothing(
    store: TaskStore,
) -> None:
    """A listing of every type reads the types again for each page: a type created (or
    deleted) between two pages moved the others' places, and the cursor, which held a
    place, sent the next page into another type (tasks listed twice, or skipped)."""
    for kind in ("email", "sms"):
        await store.create_many(
            [TaskSpec(kind, EVERY_MINUTE, task_id=f"{kind}-{i}") for i in range(30)]
        )
    seen: list[str] = []
    page, cursor = await store.list_tasks(limit=40)
    seen += [t.task_id for t in page]
    assert cursor is not None and cursor.partition("~")[0].endswith("-sms")  # in the second type
    await store.create(TaskSpec("alerts", EVERY_MINUTE, task_id="alerts-0"))  # sorts first
    while cursor is not None:
        page, cursor = await store.list_tasks(cursor=cursor, limit=7)
        seen += [t.task_id for t in page]
    assert sorted(seen) == sorted(f"{k}-{i}" for k in ("email", "sms") for i in range(30))
    with pytest.raises(InvalidTask, match="out of range"):
        await store.list_tasks(cursor="0-99-0-sms", limit=7)
    page, cursor = await store.list_tasks(cursor="0-0-0-zzz", limit=7)  # a type gone, the last
    assert (page, cursor) == ([], None)
    with pytest.raises(InvalidTask, match="not a cursor this listing returned"):
        await store.list_tasks(task_type="sms", cursor="0-1-0-sms", limit=7)
