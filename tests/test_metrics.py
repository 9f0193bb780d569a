"""Prometheus metrics: counted from the lifecycle events, summed over a node's processes,
scraped from the API and from the ``[metrics] bind`` listener of a real node; compared with
what a recording handler saw and what Redis holds."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import trio
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.execution.reading import lag_from
from actors.observability.metrics import count_events, declare_series
from actors.observability.metrics_writer import MetricsWriter
from actors.observability.redis_gauges import RedisGauges
from actors.store.flights import with_origin
from actors.store.messages import Message
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext
from runtime.config import RedisSection
from runtime.embedded_redis import find_server_binary
from runtime.logging import (
    emit_encoded,
    emit_events,
    get_logger,
    notify_observers,
    observe_events,
    stop_observing,
)
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import RedisProcess
from tests.execution_harness import records, wait_until
from tests.node_process import NodeProcess
from tests.test_processes import api_section, free_port, write_config
from tests.waiting import eventually


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def type_sample(kind: str, name: str, **labels: str) -> float:
    """A sample of this process's registry for task type ``kind`` (0 when absent)."""
    return REGISTRY.get_sample_value(name, {"type": kind, **labels}) or 0.0


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """``count_events`` observes what is logged (or notified) within the block."""
    observe_events(count_events)
    try:
        yield
    finally:
        stop_observing(count_events)


def test_events_become_samples_with_bounded_labels() -> None:
    kind = f"unit{time.monotonic_ns()}"
    fire = {"task_id": "t1", "schedule_id": "t1:1", "type": kind, "attempt": 0}
    with counting():
        emit_events("node/x", [
            ("queued", fire), ("queued", {**fire, "attempt": 1}),
            ("running", {**fire, "start_lag_ms": 30}),
            ("retried", {**fire, "duration_ms": 7000, "error": "timeout: handler ran longer"}),
            ("dead", {**fire, "duration_ms": 1, "reason": "unrecoverable", "error": "x"}),
            ("dead", {"msg_id": "1-0", "type": kind, "reason": "poison"}),
            ("misfired", {**fire, "policy": "coalesce", "missed": 4, "fired": 1}),
            ("not_run", {**fire, "reason": "paused", "count": 7}),  # one line for a pause's
            ("duplicate_dropped", fire), ("reclaimed", fire),
        ])  # fmt: skip

    get = functools.partial(type_sample, kind)

    assert get("metronome_fires_enqueued_total", attempt="first") == 1
    assert get("metronome_fires_enqueued_total", attempt="retry") == 1
    assert get("metronome_fires_started_total") == 1
    assert get("metronome_fires_finished_total", outcome="retried") == 1
    assert get("metronome_fires_finished_total", outcome="dead") == 1
    assert get("metronome_fire_timeouts_total") == 1
    assert get("metronome_retries_scheduled_total") == 1
    assert get("metronome_dead_letters_total", reason="unrecoverable") == 1
    assert get("metronome_dead_letters_total", reason="poison") == 1
    assert get("metronome_misfires_total", policy="coalesce") == 1
    assert get("metronome_fires_not_run_total", reason="coalesced") == 4
    assert get("metronome_fires_not_run_total", reason="paused") == 7
    assert get("metronome_duplicates_dropped_total") == 1
    assert get("metronome_reclaims_total") == 1
    assert get("metronome_start_lag_seconds_bucket", le="0.05") == 1
    assert get("metronome_start_lag_seconds_bucket", le="0.025") == 0
    assert get("metronome_handler_duration_seconds_count") == 2


def test_a_held_back_type_counts_as_a_rejected_step() -> None:
    """A type's stream rejected is not waited on (its fires are held back), but the
    refusals counter, and with it the ``MetronomeRedisRefusing`` alert, still sees it."""
    name = "metronome_redis_refusals_total"
    before = REGISTRY.get_sample_value(name, {"kind": "rejected"}) or 0.0
    with counting():
        emit_events("node/x", [
            ("fires_held_back", {"type": "t", "error": "WRONGTYPE"}),
            ("retries_held_back", {"partition": "3", "error": "WRONGTYPE"}),
            ("fires_resumed", {"type": "t"}),
        ])  # fmt: skip
    assert (REGISTRY.get_sample_value(name, {"kind": "rejected"}) or 0.0) - before == 2


async def test_while_a_writer_runs_counts_are_written_by_it_and_none_are_lost() -> None:
    """With a ``MetricsWriter`` running, a batch's counts wait for its next write (every
    0.25 s); as it stops it writes the rest, and batches are written at once again."""
    kind = f"unit{time.monotonic_ns()}"
    started = {"type": kind, "start_lags_ms": [3, 40, 900]}
    get = functools.partial(type_sample, kind)
    with counting():
        async with trio.open_nursery() as nursery:
            await nursery.start(MetricsWriter().run, ActorContext("node/mw", 1.0, get_logger()))
            notify_observers("node/x", [("runs_started", started)])
            assert get("metronome_fires_started_total") == 0  # gathered, not written yet
            await eventually(lambda: get("metronome_fires_started_total") == 3, 10)
            notify_observers("node/x", [("runs_started", started)])
            nursery.cancel_scope.cancel()
        assert get("metronome_fires_started_total") == 6  # written as the writer stopped
        assert get("metronome_start_lag_seconds_bucket", le="0.05") == 4
        notify_observers("node/x", [("runs_started", started)])
        assert get("metronome_fires_started_total") == 9  # at once: no writer runs


async def test_counts_from_threads_while_the_writer_writes_are_all_written() -> None:
    """Lines logged from threads (an I/O thread's) while the writer takes and writes what
    was gathered: every count lands once."""
    kind = f"unit{time.monotonic_ns()}"
    threads, each = 4, 2000

    def log_from_a_thread() -> None:
        for i in range(each):
            notify_observers("node/x", [("duplicate_dropped", {"type": kind})])
            if i % 50 == 0:
                time.sleep(0.005)  # spread over several of the writer's writes

    with counting():
        async with trio.open_nursery() as nursery:
            await nursery.start(MetricsWriter().run, ActorContext("node/mw", 1.0, get_logger()))
            async with trio.open_nursery() as logging:
                for _ in range(threads):
                    logging.start_soon(trio.to_thread.run_sync, log_from_a_thread)
            nursery.cancel_scope.cancel()
    assert type_sample(kind, "metronome_duplicates_dropped_total") == threads * each


def test_fires_not_run_are_counted_by_reason_from_not_run_and_misfired_lines() -> None:
    """One ``not_run`` line a fire (overlap, expired), and the ``missed`` count of a
    ``misfired`` line by its policy; a reason outside the known set counts as ``other``."""
    kind = f"unit{time.monotonic_ns()}"
    fire = {"task_id": "t1", "schedule_id": "t1:2000", "type": kind, "due_ms": 2000}
    with counting():
        emit_events("node/x", [
            ("not_run", {**fire, "reason": "overlap", "blocking": "t1:1000"}),
            ("not_run", {**fire, "reason": "overlap"}),
            ("not_run", {**fire, "reason": "expired"}),
            ("not_run", {**fire, "reason": "a reason from a newer version"}),
            ("misfired", {**fire, "policy": "skip", "missed": 3, "fired": 0}),
            ("misfired", {**fire, "policy": "coalesce", "missed": 2, "fired": 1}),
            ("misfired", {**fire, "policy": "fire_all", "missed": 5, "fired": 10}),
            ("misfired", {**fire, "policy": "fire_all", "missed": 0, "fired": 4}),
        ])  # fmt: skip

    def get(reason: str) -> float:
        return type_sample(kind, "metronome_fires_not_run_total", reason=reason)

    assert (get("overlap"), get("expired"), get("other")) == (2, 1, 1)
    assert (get("misfire_skip"), get("coalesced"), get("misfire_cap")) == (3, 2, 5)
    assert type_sample(kind, "metronome_misfires_total", policy="fire_all") == 2


def test_a_run_a_newer_fire_cancelled_counts_as_finished_cancelled() -> None:
    """A ``cancel_other`` fire ends the run in flight: counted started, it counts finished
    too (else started - finished drifts up for every such task)."""
    kind = f"unit{time.monotonic_ns()}"
    fire = {"task_id": "t1", "schedule_id": "t1:2000", "type": kind, "due_ms": 2000}
    with counting():
        emit_events("node/x", [("cancelled", {**fire, "duration_ms": 1500, "reason": "overlap"})])
    assert type_sample(kind, "metronome_fires_finished_total", outcome="cancelled") == 1


def test_a_batchs_summary_counts_as_its_per_fire_events_would() -> None:
    """Where the per-fire debug lines ``queued`` and ``running`` are not written, the
    poller and the reader hand observers one summary a batch, and the consumer one for its
    ``finished`` lines: the same samples."""
    kind = f"unit{time.monotonic_ns()}"
    with counting():
        notify_observers("node/x", [("fires_queued", {"type": kind, "first": 3, "retry": 2})])
        notify_observers("node/x", [("fires_queued", {"type": kind, "first": 1})])
        notify_observers(
            "node/x", [("runs_started", {"type": kind, "start_lags_ms": [10, 30, -5]})]
        )
        emit_encoded(
            "node/x", "finished", [',"type":"x"'] * 3,
            ("runs_finished", {"type": kind, "durations_ms": [5, 0, 2000]}), list,
        )  # fmt: skip

    get = functools.partial(type_sample, kind)

    assert get("metronome_fires_enqueued_total", attempt="first") == 4
    assert get("metronome_fires_enqueued_total", attempt="retry") == 2
    assert get("metronome_fires_started_total") == 3
    assert get("metronome_start_lag_seconds_count") == 3
    assert get("metronome_start_lag_seconds_bucket", le="0.025") == 2  # 10 ms and -5 (as 0)
    assert get("metronome_start_lag_seconds_bucket", le="0.05") == 3
    assert get("metronome_fires_finished_total", outcome="ok") == 3
    assert get("metronome_handler_duration_seconds_count") == 3
    assert get("metronome_handler_duration_seconds_bucket", le="0.005") == 2


def test_the_cli_imports_no_metrics_library_before_a_node_sets_it_up() -> None:
    """prometheus-client picks its storage when imported: ``metronome serve`` must reach
    ``runtime.metrics.enable_multiprocess`` before anything imports it."""
    code = "import sys, actors.admin.cli; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


@pytest.fixture
async def store(redis_client: RedisClient, namespace: str) -> TaskStore:
    return TaskStore(redis_client, namespace, default_partitions=4)


async def test_a_node_with_child_processes_reports_its_totals_on_both_endpoints(
    store: TaskStore, tmp_path: Path, redis_url: str, namespace: str, record: Path
) -> None:
    """Scheduler and consumers in child processes, the API in the main one: /metrics on
    the API and on the [metrics] listener both show what the children counted, equal to
    what the recording handler saw, and the gauges equal what Redis holds."""
    api_port, metrics_port = free_port(), free_port()
    extra = api_section(api_port) + (
        f'[metrics]\nbind = "127.0.0.1:{metrics_port}"\ncache_s = 0\nstatus_count_interval_s = 1\n'
    )
    config = write_config(
        tmp_path, redis_url, namespace, processes="scheduler = 1\nconsumers = 1", extra=extra
    )
    schedule = Schedule("once", at_ms=await store.now_ms())
    ids = [c.task_id for c in await store.create_many([TaskSpec("work", schedule)] * 25)]
    far = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    await store.create_many([TaskSpec("work", far)] * 3)
    node = NodeProcess(config)
    try:
        await trio.to_thread.run_sync(node.wait_for, "metrics_listening")

        async def all_ran() -> bool:
            return {e["task_id"] for e in records(record) if e["event"] == "ran"} >= set(ids)

        await wait_until(all_ran)

        def scrape(port: int) -> str:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text

        def counted() -> bool:  # each process writes its counts on its own 0.25 s beat
            text = scrape(api_port)
            return (
                value(text, "metronome_fires_finished_total", type="work", outcome="ok") >= 25
                and value(text, "metronome_fires_started_total", type="work") >= 25
                and value(text, "metronome_fires_enqueued_total", type="work", attempt="first")
                >= 25
                and value(text, "metronome_start_lag_seconds_count", type="work") >= 25
            )

        async def all_counted() -> bool:
            return await trio.to_thread.run_sync(counted)

        await wait_until(all_counted)
        text = scrape(api_port)
        seen = [e for e in records(record) if e["event"] == "ran"]
        assert value(text, "metronome_fires_finished_total", type="work", outcome="ok") == len(seen)
        assert value(text, "metronome_fires_started_total", type="work") == len(seen)
        assert value(text, "metronome_fires_enqueued_total", type="work", attempt="first") == 25
        assert value(text, "metronome_start_lag_seconds_count", type="work") == len(seen)
        assert value(text, "metronome_redis_up") == 1
        assert value(text, "metronome_tasks_scheduled") == 3  # the once tasks are finished
        assert value(text, "metronome_queue_consumers", type="work") == 1

        async def statuses_counted() -> bool:
            text = await trio.to_thread.run_sync(scrape, api_port)
            return value(text, "metronome_tasks", status="finished") == 25

        await wait_until(statuses_counted)
        text = scrape(api_port)
        assert value(text, "metronome_tasks", status="active") == 3
        assert value(text, "metronome_tasks", status="paused") == 0
        other = scrape(metrics_port)
        for name in ("metronome_fires_finished_total", "metronome_fires_enqueued_total"):
            assert {k: v for k, v in samples(other).items() if k[0] == name} == {
                k: v for k, v in samples(text).items() if k[0] == name
            }
    finally:
        await trio.to_thread.run_sync(node.kill)


def exported_names() -> set[str]:
    """Every sample name a node can export (counters, histograms, the Redis gauges)."""
    import actors.observability.metrics  # noqa: F401  (registers the metrics)
    from actors.observability.redis_gauges import Reading, RedisGauges

    names = set()
    for family in REGISTRY.collect():
        if not family.name.startswith("metronome_"):
            continue
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    gauges = RedisGauges(None, 0)  # type: ignore[arg-type]  # collect() reads no store
    queue = {"type": "t", "length": 1, "undelivered": 1, "pending": 0, "consumers": [],
             "oldest_pending_age_ms": None, "dead_letters": 0}  # fmt: skip
    gauges.reading = Reading(0.0, True, 0.001, [queue], 1, 0)
    names |= {family.name for family in gauges.collect()}
    return names


def test_the_grafana_board_and_the_alert_rules_use_only_metrics_a_node_exports() -> None:
    deploy = Path(__file__).parent.parent / "deploy" / "observability"
    board = json.loads((deploy / "grafana" / "metronome.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    rules = yaml.safe_load((deploy / "alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {name for e in exprs for name in re.findall(r"metronome_[a-z_]+", e)}
    assert used and used <= exported_names(), used - exported_names()
    titles = {p["title"] for p in board["panels"]}
    for wanted in ("Fires/s by type", "Start lag p50 / p99", "Outcomes", "Backlog and running",
                   "Dead letters and retries", "Actor restarts and give-ups"):  # fmt: skip
        assert wanted in titles


async def test_tasks_are_counted_by_status(store: TaskStore) -> None:
    later = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    ids = [c.task_id for c in await store.create_many([TaskSpec("count", later)] * 7)]
    await store.pause(ids[0])
    await store.pause(ids[1])
    await store.stop(ids[2])
    counts = await store.count_by_status(buckets_per_call=100)
    assert counts == {"active": 4, "paused": 2, "stopped": 1, "finished": 0, "unreadable": 0}


async def test_a_state_bucket_of_another_kind_is_named_where_tasks_are_counted(
    store: TaskStore, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    """A bucket Redis will not read as a hash holds tasks no one can count: the count
    goes on over the others and names it, rather than leaving it out without a word."""
    later = Schedule("interval", every_s=3600, start_ms=await store.now_ms() + 3_600_000)
    await store.create_many([TaskSpec("count", later, task_id=f"t{i}") for i in range(5)])
    keys = await store.keys()
    broken = keys.states(keys.partition_of("t0"), keys.bucket_of("t0"))
    await store.client.execute("DEL", broken)
    await store.client.execute("SET", broken, "not a hash")
    counts = await store.count_by_status(buckets_per_call=100)
    lost = [
        i
        for i in range(5)
        if keys.states(keys.partition_of(f"t{i}"), keys.bucket_of(f"t{i}")) == broken
    ]
    assert counts["active"] == 5 - len(lost) and counts["unreadable"] == 0
    (line,) = [x for x in log_lines() if x["event"] == "task_count_incomplete"]
    assert (line["buckets"], line["keys"], line["level"]) == (1, [broken], "warning")
    assert line["error"].startswith("WRONGTYPE")


def test_start_lag_counts_a_retry_or_manual_fire_from_when_it_was_appended() -> None:
    """Start lag says whether consumers keep up: a scheduled fire's first attempt counts
    from its due time, a retry (its backoff), a trigger, backfill or replay (a past due
    time) from when it was appended, or MetronomeStartLagHigh fired on idle consumers."""

    def message(attempt: int, policy: str = "") -> Message:
        return Message("1-0", "t", "t:1000", "w", "null", attempt, 1_000, 61_000, None, policy)

    assert lag_from(message(0)) == 1_000
    assert lag_from(message(0, "S")) == 1_000  # a tracked scheduled fire
    assert lag_from(message(1)) == 61_000
    for letter in "tbr":  # trigger, backfill, replay
        assert lag_from(message(0, with_origin("S", letter))) == 61_000


async def test_a_stalled_redis_reads_as_down_before_a_scrape_times_out() -> None:
    """Redis stalled (every command paused): the gauges' reading answers Redis down after
    a bound, not when the pause ends (a scrape timed out first and the node read as down,
    the alert for Redis never firing)."""
    server = RedisProcess(find_server_binary()).start()
    section = RedisSection(url=server.url, socket_timeout_s=60)
    client = RedisClient.from_settings(server.url, section)
    pauser: Any = redis.Redis.from_url(server.url)
    try:
        store = TaskStore(client, "stall", default_partitions=2)
        await store.create(TaskSpec("work", Schedule("interval", every_s=60)))
        gauges = RedisGauges(store, cache_s=0)
        assert (await gauges.refresh()).up
        pauser.execute_command("CLIENT", "PAUSE", 4_000, "ALL")  # past the 2 s bound
        assert not (await gauges.refresh()).up
        await trio.to_thread.run_sync(pauser.ping)  # the pause over
        assert (await gauges.refresh()).up
    finally:
        pauser.close()
        await client.aclose()
        server.stop()


def test_the_series_the_alerts_watch_are_laid_down_at_zero() -> None:
    """``increase()`` never sees a series' first count: a type's first dead letter of a
    reason, a first refusal of a kind, would not fire their alerts. A node lays those
    series down at 0 when it starts."""
    kind = f"zero{time.monotonic_ns()}"
    assert (
        REGISTRY.get_sample_value(
            "metronome_dead_letters_total", {"type": kind, "reason": "failed"}
        )
        is None
    )
    declare_series([kind])
    for reason in ("failed", "unrecoverable", "poison", "malformed"):
        labels = {"type": kind, "reason": reason}
        assert REGISTRY.get_sample_value("metronome_dead_letters_total", labels) == 0.0
    for refusal in ("refused_write", "permission", "rejected"):
        assert (
            REGISTRY.get_sample_value("metronome_redis_refusals_total", {"kind": refusal})
            is not None
        )
