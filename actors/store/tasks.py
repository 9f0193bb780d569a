"""Task store operations: the API, the CLI and the benchmark build on these.

Each operation on one task is one Lua script in the task's partition slot (atomic, safe
under concurrent updates). Bulk operations group tasks by partition and pipeline one script
call per partition, so 10,000 creates cost a handful of round trips. Nothing here touches
more than a batch per Redis call: clearing a million tasks is many short calls.

The namespace's partition and bucket counts are fixed when the namespace is first used and
stored in its meta key; every node reads them from there (``actors.store.namespace``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from actors.domain.errors import (
    InvalidTask,
    TaskConflict,
)
from actors.domain.labels import check_labels, encode_labels
from actors.domain.model import Task, TaskSpec, check_payload_depth, encode_payload, new_task_id
from actors.domain.schedules import Overlap, Schedule
from actors.store import backfill as backfilling
from actors.store import backfill_window, manual_fires, type_scans
from actors.store.codes import Code, raise_for_code
from actors.store.flights import DEFAULT_CLAIM_LEASE_MS, dropped_lines
from actors.store.history import DEFAULT_HISTORY, latest_fate
from actors.store.keys import (
    DEFAULT_BUCKETS,
    Keys,
)
from actors.store.labels import STORE_ACTOR, TaskFilter, list_page
from actors.store.namespace import meta_fields, meta_key, read_keys
from actors.store.notes import encode_note
from actors.store.placement import Placement, kept_grid, paused_line, paused_skips, resume_point
from actors.store.records import RecordError, decode_task, encode_schedule
from actors.store.replies import TaskRow
from actors.store.scripts import Scripts
from actors.store.streams import Streams
from runtime.config import check_name
from runtime.logging import emit_events
from runtime.redis_io import RedisClient


@attrs.frozen
class Created:
    task_id: str
    created: bool
    """False when a task with this id and the same definition already existed."""
    conflict: bool = False
    """True when a task with this id exists with another definition (nothing changed)."""


class _Keep:
    """Marker: leave this field as it is."""


KEEP = _Keep()


#: An update placed from a schedule another update replaced meanwhile is read and placed
#: again, at most this many times in all.
_UPDATE_TRIES = 10


class TaskStore:
    def __init__(
        self,
        client: RedisClient,
        namespace: str,
        default_partitions: int = 16,
        default_buckets: int = DEFAULT_BUCKETS,
        takeover_ms: int = DEFAULT_CLAIM_LEASE_MS,
        history: int = DEFAULT_HISTORY,
    ) -> None:
        self.client = client
        self.namespace = check_name("namespace", namespace)
        self.takeover_ms = takeover_ms
        """The pollers' claim lease (``[scheduler] claim_lease_ms``): how old a poller's
        unconfirmed fire in flight must be before an operator's trigger, backfill or action
        appends it again (``manual_fires.fire_under``)."""
        self.history = history
        """Occurrences kept per task (``[scheduler] history``): the length an operator's
        decision keeps the ring at when it records grid times its fire displaced."""
        self._default_partitions = default_partitions
        self._default_buckets = default_buckets
        self._keys: Keys | None = None
        self._scripts: Scripts | None = None
        self._streams: Streams | None = None
        self._known_types: set[str] = set()

    # -- namespace ------------------------------------------------------------------------

    async def keys(self) -> Keys:
        """The namespace's keys, creating its meta record on first use
        (``namespace.read_keys``)."""
        if self._keys is None:
            self._keys = await read_keys(
                self.client, self.namespace, self._default_partitions, self._default_buckets
            )
        return self._keys

    async def keep_meta(self) -> None:
        """Lay the meta key down again, with what this store read from it, if it is gone
        (Redis back empty, a hand delete, an eviction), so a node that starts then reads
        the namespace as it is instead of being refused (``namespace.read_keys``): the
        running nodes know its counts. The key is written whole, in one script, and only
        when it is gone (``keep_meta.lua``); nothing before this store has read it. Every
        process calls it every few seconds (``actors.observability.presence``)."""
        if self._keys is not None:
            await (await self.scripts()).keep_meta(
                meta_key(self.namespace), meta_fields(self._keys)
            )

    async def scripts(self) -> Scripts:
        """The namespace's scripts (``actors.store.scripts``): the roles' door to Redis."""
        if self._scripts is None:
            self._scripts = Scripts(self.client, await self.keys())
        return self._scripts

    async def streams(self) -> Streams:
        """The namespace's plain stream commands (``actors.store.streams``)."""
        if self._streams is None:
            self._streams = Streams(self.client, await self.keys())
        return self._streams

    async def now_ms(self) -> int:
        """Redis's clock (``RedisClient.clock_ms``: at most a second-old reading carried
        forward), to place new grid times; the scripts decide due-ness with TIME."""
        return await self.client.clock_ms()

    # -- create ---------------------------------------------------------------------------

    async def create(self, spec: TaskSpec) -> Created:
        (result,) = await self.create_many([spec])
        return result

    async def create_many(
        self, specs: Sequence[TaskSpec], *, raise_conflicts: bool = True
    ) -> list[Created]:
        """Create tasks in one round trip per call (scripts pipelined, one per partition).

        Raises TaskConflict (naming the ids) if a client-given id exists with another
        definition; the other tasks of the call are created all the same. With
        ``raise_conflicts=False`` conflicts are reported per task (``Created.conflict``).
        """
        keys = await self.keys()
        now = await self.now_ms()
        ids = [spec.task_id or new_task_id() for spec in specs]
        if len(set(ids)) != len(ids):
            raise InvalidTask("task_id: the same id appears twice in one bulk create")
        groups: dict[int, list[int]] = defaultdict(list)
        for index, task_id in enumerate(ids):
            groups[keys.partition_of(task_id)].append(index)
        placed = Placement(now)
        rows: dict[int, list[TaskRow]] = {}
        for partition, indexes in groups.items():
            rows[partition] = []
            for index in indexes:
                spec = specs[index]
                sched, next_ms, score = placed.of(spec.schedule, ids[index])
                row = TaskRow(ids[index], spec.type, spec.payload_json(), sched, next_ms, score,
                              spec.labels_json())  # fmt: skip
                rows[partition].append(row)
        new_types = {spec.type for spec in specs} - self._known_types
        if new_types:  # types are never removed from the set: remembering them is safe
            # Before the tasks: a type added after them, if that add failed (the node
            # gone, Redis away), would leave them out of every walk by type (``all``
            # selectors, counts by status) until the next create of that type.
            await self.client.execute("SADD", keys.types, *new_types)
            self._known_types |= new_types
        replies = await (await self.scripts()).create_tasks(rows)
        codes: dict[int, int] = {}
        for partition, indexes in groups.items():
            codes.update(zip(indexes, replies[partition], strict=True))
        emit_events(
            STORE_ACTOR,
            [
                ("created", {"task_id": ids[i], "type": specs[i].type})
                for i in range(len(specs))
                if codes[i] == Code.OK
            ],
        )
        conflicts = [ids[i] for i, code in codes.items() if code < 0]
        if conflicts and raise_conflicts:
            raise TaskConflict(
                "tasks exist with a different type, payload, schedule or labels: "
                + ", ".join(conflicts)
            )
        return [Created(ids[i], codes[i] == Code.OK, codes[i] < 0) for i in range(len(specs))]

    # -- read -----------------------------------------------------------------------------

    async def get(self, task_id: str) -> Task | None:
        (task,) = await self.get_many([task_id])
        return task

    async def _definition_and_state(self, task_id: str) -> Task | None:
        """The task as its definition and state records say (what an update places from):
        its run record and history are not read, so a broken one fails no update."""
        keys = await self.keys()
        partition, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
        definition, state = await self.client.reads(  # a key of another kind: raised
            [
                ("HGET", keys.definitions(partition, bucket), task_id),
                ("HGET", keys.states(partition, bucket), task_id),
            ]
        )
        return decode_task(task_id, definition, state, None) if definition and state else None

    async def get_many(
        self, task_ids: Sequence[str], unreadable: list[tuple[str, str]] | None = None
    ) -> list[Task | None]:
        """Tasks by id, None for those that do not exist; one round trip. A task whose
        records cannot be decoded raises ``RecordError``; given ``unreadable``, it is
        None instead and ``(task_id, why)`` is appended there (a listing goes on past
        it, and says so)."""
        keys = await self.keys()
        commands: list[tuple[Any, ...]] = []
        for task_id in task_ids:
            partition, bucket = keys.partition_of(task_id), keys.bucket_of(task_id)
            commands += [
                ("HGET", keys.definitions(partition, bucket), task_id),
                ("HGET", keys.states(partition, bucket), task_id),
                ("HGET", keys.runs(partition, bucket), task_id),
                ("HGET", keys.errors(partition), task_id),
                ("HGET", keys.labels(partition), task_id),
                ("HGET", keys.history(partition), task_id),
            ]
        # a key of another kind: raised, not a TypeError
        replies = await self.client.reads(commands) if commands else []
        tasks: list[Task | None] = []
        for i, task_id in enumerate(task_ids):
            definition, state, run, error, labels, ring = replies[6 * i : 6 * i + 6]
            # Both records or neither: the scripts write and delete them together.
            try:
                task = (
                    decode_task(task_id, definition, state, error, run, labels)
                    if definition
                    else None
                )
            except RecordError as exc:
                if unreadable is None:
                    raise
                unreadable.append((task_id, str(exc)))
                tasks.append(None)
                continue
            if task is not None and ring is not None:
                task = attrs.evolve(task, last_fate=latest_fate(ring))
            tasks.append(task)
        return tasks

    async def list_tasks(
        self,
        task_type: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 100,
        max_calls: int = 64,
        *,
        labels: Mapping[str, str] | None = None,
        next_before: int | None = None,
        last_status: str | None = None,
        last_fate: str | None = None,
        unreadable: list[tuple[str, str]] | None = None,
    ) -> tuple[list[Task], str | None]:
        """A page of tasks, filtered by type, status, labels (every pair must match), next
        fire (at or before ``next_before``) and last outcome; pass the returned cursor back
        for the next page (None = done). Pages may be shorter than ``limit`` (even empty)
        when filtering: one call reads at most ``max_calls`` index pages and about
        ``labels.MAX_LIST_READ`` tasks, so a rare status over ten million tasks costs many
        short calls, never one long one. With labels, the
        index of the first pair is read (``actors.store.labels``). A task whose records
        cannot be decoded fails the call, or, given ``unreadable``, is left out of the page
        and named there with why (``get_many``)."""
        wanted = TaskFilter(
            task_type, status, dict(labels or {}), next_before, last_status, last_fate
        )
        return await list_page(self, wanted, cursor, limit, max_calls, unreadable)

    async def count_by_status(self, buckets_per_call: int = 256) -> dict[str, int]:
        """Tasks per status, every state record read: ``type_scans.count_by_status``."""
        return await type_scans.count_by_status(self, buckets_per_call)

    async def types(self) -> list[str]:
        keys = await self.keys()
        members = await self.client.execute("SMEMBERS", keys.types)
        return sorted(m.decode(errors="replace") for m in members)

    # -- change ---------------------------------------------------------------------------

    async def trigger(self, task_id: str, overlap: Overlap = "allow_all") -> tuple[str, bool]:
        """Run a task now, once, outside its schedule: ``manual_fires.trigger``; the
        fire's schedule_id and whether it was queued now."""
        return await manual_fires.trigger(self, task_id, overlap, STORE_ACTOR)

    async def backfill(
        self, task_id: str, start_ms: int, end_ms: int, **options: Any
    ) -> backfilling.TaskBackfill:
        """Run the task's grid times in ``[start_ms, end_ms)`` (a past window), each once
        however often this is repeated; ``actors.store.backfill.backfill_task`` (options:
        overlap, dry_run, max_fires, rate)."""
        return await backfilling.backfill_task(self, task_id, start_ms, end_ms, **options)

    async def backfill_type(
        self, task_type: str, start_ms: int, end_ms: int, **options: Any
    ) -> list[backfilling.TaskBackfill]:
        """``backfill`` for every active or paused task of a type, bounded in total
        (``actors.store.backfill.backfill_type``)."""
        return await backfilling.backfill_type(self, task_type, start_ms, end_ms, **options)

    async def update(
        self,
        task_id: str,
        *,
        payload: Any = KEEP,
        schedule: Schedule | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Replace payload, schedule and/or labels (the whole set; None keeps them);
        returns the task's status afterwards."""
        payload_json = ""
        if not isinstance(payload, _Keep):
            check_payload_depth(payload)
            payload_json = encode_payload(payload)
        labels_json = "" if labels is None else encode_labels(check_labels(labels)) or "{}"
        # Nothing waits behind a fire of a task of no policy (no claim would start it):
        # fires held back under its former policy go with its flight record.
        tracked = schedule is not None and schedule.overlap != "allow_all"
        for _ in range(_UPDATE_TRIES):  # placed again while other updates change it
            sched: bytes | str = ""
            next_ms: int | None = None
            score: int | None = None
            read, kept = b"", None
            if schedule is not None:
                now = await self.now_ms()
                sched, next_ms, score = Placement(now).of(schedule, task_id)
                task = await self._definition_and_state(task_id)
                if task is not None:
                    read = encode_schedule(task.schedule)
                    grid = await backfill_window.grid_of(self, task)
                    kept = kept_grid(task, schedule.for_task(task_id), now, grid)
            code, status, placed, dropped, task_type = await (await self.scripts()).update_task(
                task_id, payload_json, sched, next_ms, score, labels_json, tracked, kept, read
            )
            if code != Code.CONFLICT:
                break
        else:
            raise TaskConflict(f"task {task_id!r}: its schedule kept changing; update it again")
        raise_for_code(code, task_id)
        if not placed:  # sent as it is: nothing of the grid changed
            sched = ""
        changed = [
            f
            for f, new in (("payload", payload_json), ("schedule", sched), ("labels", labels_json))
            if new
        ]
        lines = [("updated", {"task_id": task_id, "fields": changed})]
        lines += dropped_lines(task_id, task_type, dropped, "updated")
        emit_events(STORE_ACTOR, lines)
        return status

    async def pause(self, task_id: str, note: str | None = None, by: str | None = None) -> str:
        """Pause; ``note`` (``actors.store.notes``), from key ``by``, is kept with it."""
        return await self._set_status(task_id, "pause", note, by)

    async def resume(self, task_id: str, note: str | None = None, by: str | None = None) -> str:
        return await self._set_status(task_id, "resume", note, by)

    async def stop(self, task_id: str) -> str:
        return await self._set_status(task_id, "stop")

    async def _set_status(
        self, task_id: str, action: str, note: str | None = None, by: str | None = None
    ) -> str:
        stored = "" if note is None else encode_note(note, action, await self.now_ms(), by)
        for _ in range(10):  # a resume placed from a version another write replaced: again
            next_ms: int | None = None
            score: int | None = None
            version: int | None = None
            tracked = False
            task = skipped = None
            if action == "resume":
                task = await self._definition_and_state(task_id)
                if task is not None:
                    now = await self.now_ms()
                    next_ms, score = resume_point(task, now)
                    tracked = task.schedule.overlap != "allow_all"
                    scripts = await self.scripts()
                    decided = (await scripts.latest_decided([task_id])) if tracked else {}
                    skipped = paused_skips(task, now, decided.get(task_id))
                    version = task.updated_ms
            code, status, dropped, task_type = await (await self.scripts()).set_status(
                task_id, action, next_ms, score, stored, tracked, version, skipped
            )
            if code != Code.CONFLICT:
                break
        else:
            raise TaskConflict(f"task {task_id!r}: it kept changing; resume it again")
        raise_for_code(code, task_id, f"cannot {action} a {status} task")
        if code == Code.OK:
            event = {"pause": "paused", "resume": "resumed", "stop": "stopped"}[action]
            noted = {"note": note} if note is not None else {}
            lines = [(event, {"task_id": task_id, "status": status, **noted})]
            if task is not None and skipped is not None:
                lines.append(paused_line(task, skipped))
            emit_events(STORE_ACTOR, lines + dropped_lines(task_id, task_type, dropped, "stopped"))
        return status

    async def delete(self, task_id: str) -> bool:
        deleted = await (await self.scripts()).delete_tasks([task_id]) == 1
        emit_events(STORE_ACTOR, [("deleted", {"task_id": task_id})] if deleted else [])
        return deleted

    async def delete_many(self, task_ids: Iterable[str]) -> int:
        """Delete many tasks; one ``deleted`` line with the ids asked for and the count
        that existed."""
        ids = list(task_ids)
        deleted = await (await self.scripts()).delete_tasks(ids)
        emit_events(
            STORE_ACTOR, [("deleted", {"task_ids": ids, "count": deleted})] if deleted else []
        )
        return deleted

    async def clear_type(self, task_type: str) -> int:
        """Delete every task of a type (``type_scans.delete_type``), then say so once."""
        deleted = await type_scans.delete_type(self, task_type)
        emit_events(STORE_ACTOR, [("cleared", {"type": task_type, "count": deleted})])
        return deleted
