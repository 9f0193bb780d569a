"""Gauges read from Redis when ``/metrics`` is scraped: queues, retries, the schedule, the
attention list, and Redis itself.

Counters live in the processes that count (``metrics``); what Redis holds is read here, by
the process serving the scrape, in a few pipelined round trips whatever the number of
tasks: the types, per type its stream facts (``XLEN``, ``XINFO GROUPS``/``CONSUMERS``,
``XPENDING`` summary, DLQ ``XLEN``), per partition the ``ZCARD`` of the schedule and retry
sets, and per partition the attention list's counts (``actors.store.ledger``). Readings
are cached for ``cache_s``, so scrapes by several Prometheus servers (or a dashboard) cost
Redis one reading per interval. Redis unreachable, or slower to answer than
``READ_TIMEOUT_S`` (stalled), is a reading too: ``metronome_redis_up 0`` and the last
queue figures are left out rather than made up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import attrs
import trio
from prometheus_client.core import GaugeMetricFamily, Metric

from actors.store.ledger import attention_counts
from actors.store.queue_rows import queue_row
from actors.store.tasks import TaskStore
from runtime.errors import RedisUnavailable
from runtime.logging import get_logger
from runtime.redis_io import ResponseError
from runtime.redis_replies import reply_text

#: Longest a reading may take: Redis slower than that is down to a scrape.
READ_TIMEOUT_S = 2.0


@attrs.frozen
class Reading:
    """One reading of Redis, at ``at`` (monotonic seconds)."""

    at: float
    up: bool
    round_trip_s: float | None = None
    queues: list[dict[str, Any]] = attrs.field(factory=list)
    scheduled: int = 0
    retrying: int = 0
    attention: dict[tuple[str, str], int] = attrs.field(factory=dict)
    """Tasks on the attention list by (type, reason)."""


class RedisGauges:
    """A prometheus-client collector over the latest ``Reading``; ``refresh`` (async, in
    the serving actor) takes a new one when the cached one is older than ``cache_s``."""

    def __init__(self, store: TaskStore, cache_s: float = 2.0) -> None:
        self.store = store
        self.cache_s = cache_s
        self.reading: Reading | None = None
        self._lock = trio.Lock()
        self.statuses: dict[str, int] | None = None
        """Tasks per status at the last count (``count_statuses_forever``), if any."""
        self.statuses_at: float | None = None

    async def count_statuses_forever(self, interval_s: float) -> None:
        """Count tasks by status every ``interval_s`` (the first time after 10 s at most, so
        a node starting does not begin with it); an outage is waited through. Runs in the
        nursery of the actor that serves /metrics."""
        await trio.sleep(min(10.0, interval_s))
        while True:
            self.statuses = await self.store.client.ride_out(self.store.count_by_status)
            self.statuses_at = time.monotonic()
            await trio.sleep(interval_s)

    async def refresh(self) -> Reading:
        async with self._lock:  # concurrent scrapes share one reading
            if self.reading is not None and time.monotonic() - self.reading.at < self.cache_s:
                return self.reading
            try:
                # Bounded well inside a scrape's timeout (Prometheus': its interval, 5 s
                # here): a stalled Redis answers "down", not a scrape that times out and
                # reads as the node itself down.
                with trio.fail_after(READ_TIMEOUT_S):
                    self.reading = await self._read()
            except (RedisUnavailable, trio.TooSlowError):
                self.reading = Reading(time.monotonic(), up=False)
            except ResponseError as exc:  # a key of another kind: the scrape still answers
                get_logger(actor="node/metrics").warning(
                    "gauges_unreadable", error=reply_text(exc),
                    fix="a key in the namespace holds another kind of value; remove or mend it",
                )  # fmt: skip
                # Redis answered: up, with the last reading's figures (none at first), not
                # read again until the cache runs out
                kept = self.reading if self.reading is not None and self.reading.up else None
                self.reading = attrs.evolve(kept or Reading(0.0, up=True), at=time.monotonic())
            return self.reading

    async def _read(self) -> Reading:
        started = time.perf_counter()
        await self.store.client.execute("PING")
        round_trip = time.perf_counter() - started
        keys = await self.store.keys()
        types = await self.store.types()
        now = await self.store.now_ms()
        rows = await (await self.store.streams()).queue_infos(types)
        cards = await self.store.client.pipeline(
            [("ZCARD", keys.schedule(p)) for p in range(keys.partitions)]
            + [("ZCARD", keys.retry(p)) for p in range(keys.partitions)]
        )
        counts = [int(c) if isinstance(c, int) else 0 for c in cards]
        attention = await attention_counts(self.store)
        return Reading(
            at=time.monotonic(),
            up=True,
            round_trip_s=round_trip,
            queues=[queue_row(t, row, now, None) for t, row in zip(types, rows, strict=True)],
            scheduled=sum(counts[: keys.partitions]),
            retrying=sum(counts[keys.partitions :]),
            attention=attention,
        )

    def collect(self) -> Iterator[Metric]:
        reading = self.reading
        up = GaugeMetricFamily("metronome_redis_up", "1 when Redis answered the last reading.")
        up.add_metric([], 1 if reading is not None and reading.up else 0)
        yield up
        if reading is None or not reading.up:
            return
        if reading.round_trip_s is not None:
            yield GaugeMetricFamily(
                "metronome_redis_round_trip_seconds",
                "A PING's round trip from the serving process, at the last reading.",
                value=reading.round_trip_s,
            )
        yield GaugeMetricFamily(
            "metronome_tasks_scheduled",
            "Tasks in the schedule index: active tasks with a next fire.",
            value=reading.scheduled,
        )
        yield GaugeMetricFamily(
            "metronome_retries_waiting", "Retries waiting for their time.", value=reading.retrying
        )
        needing = GaugeMetricFamily(
            "metronome_tasks_needing_attention",
            "Tasks whose latest occurrence is dead, expired, skipped or late (GET /v1/attention).",
            labels=["type", "reason"],
        )
        for (task_type, reason), count in sorted(reading.attention.items()):
            needing.add_metric([task_type, reason], count)
        yield needing
        if self.statuses is not None and self.statuses_at is not None:
            tasks = GaugeMetricFamily(
                "metronome_tasks",
                "Tasks by status, at the last count ([metrics] status_count_interval_s).",
                labels=["status"],
            )
            for status, count in self.statuses.items():
                tasks.add_metric([status], count)
            yield tasks
            yield GaugeMetricFamily(
                "metronome_tasks_counted_seconds_ago",
                "Age of the metronome_tasks count.",
                value=time.monotonic() - self.statuses_at,
            )
        per_type = [
            ("metronome_queue_length", "Messages not done: backlog and in flight.",
             "length", 1.0),
            ("metronome_queue_undelivered", "Entries no consumer has read yet.", "undelivered",
             1.0),
            ("metronome_queue_pending", "Entries read and not yet acknowledged (running).",
             "pending", 1.0),
            ("metronome_queue_oldest_pending_age_seconds",
             "Age of the oldest entry read and not acknowledged.", "oldest_pending_age_ms",
             0.001),
            ("metronome_dead_letter_queue_length", "Entries in the type's DLQ.", "dead_letters",
             1.0),
        ]  # fmt: skip
        for name, text, field, scale in per_type:
            family = GaugeMetricFamily(name, text, labels=["type"])
            for queue in reading.queues:
                value = queue[field]
                family.add_metric([queue["type"]], 0.0 if value is None else value * scale)
            yield family
        consumers = GaugeMetricFamily(
            "metronome_queue_consumers",
            "Live consumers of the type (read within the last minute) and dead ones still "
            "holding messages.",
            labels=["type"],
        )
        for queue in reading.queues:
            consumers.add_metric([queue["type"]], len(queue["consumers"]))
        yield consumers
