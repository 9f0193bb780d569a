"""Why is this task (not) running: everything Redis knows about one task, in one answer.

The seed's hardest support question was "my task did not run — why?". ``explain`` reads the
task records, its place in the schedule index, any retry waiting for it, its messages in the
type's stream (queued, or pending on which consumer, idle how long, delivered how often)
and its dead letters, then states the answer as sentences an operator can act on.

Streams are scanned only up to ``STREAM_SCAN_CAP`` entries (the answer says when it
stopped short): a stream holds only the backlog and in-flight messages, since finished ones
are deleted, so the cap is rarely reached.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from actors.api.ledger_facts import ledger_facts, ledger_sentences
from actors.api.task_notes import note_facts, note_sentences
from actors.api.upcoming import task_upcoming
from actors.domain.errors import TaskNotFound
from actors.domain.model import Task
from actors.domain.schedules import Schedule
from actors.observability.partitions import partition_owner
from actors.store.keys import CONSUMER_GONE_MS, schedule_id
from actors.store.messages import flat_fields
from actors.store.queue_rows import (
    as_text,
    error_line,
    our_group,
    score_ms,
    stored_number,
    stream_id_key,
    stream_id_ms,
)
from actors.store.records import claim_of
from actors.store.tasks import TaskStore

#: Most stream (and dead-letter) entries read to find one task's messages.
STREAM_SCAN_CAP = 10_000
_PAGE = 1000
#: A fire this late while its task is active means nothing is serving its partition.
OVERDUE_MS = 5_000
#: Upcoming fires explain lists (``GET /v1/tasks/{task_id}/upcoming`` lists more).
UPCOMING_SHOWN = 3
#: Occurrences explain lists (``GET /v1/tasks/{task_id}/history`` lists them all).
HISTORY_SHOWN = 5


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    except (ValueError, OverflowError, OSError):  # beyond what a date can say
        return str(ms)


def describe_schedule(schedule: Schedule) -> str:
    """The schedule in words: ``every 60s``, ``cron '0 9 * * 1-5' in Europe/Paris``."""
    if schedule.kind == "interval":
        text = f"every {schedule.every_s:g}s"
    elif schedule.kind == "cron":
        text = f"cron {schedule.cron!r} in {schedule.tz}"
    else:
        text = f"once at {iso(schedule.at_ms)}"
    if schedule.start_ms is not None:
        text += f", from {iso(schedule.start_ms)}"
    if schedule.end_ms is not None:
        text += f", until {iso(schedule.end_ms)}"
    if schedule.max_runs is not None:
        text += f", at most {schedule.max_runs} runs"
    if schedule.spread_s:
        text += f", spread over {schedule.spread_s:g}s"
    if schedule.jitter_s:
        text += f", jitter up to {schedule.jitter_s:g}s"
    return text


async def explain(store: TaskStore, task_id: str) -> dict[str, Any]:
    """The explanation of one task, or TaskNotFound."""
    keys = await store.keys()
    task = await store.get(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    now = await store.now_ms()
    partition = keys.partition_of(task_id)
    score, state, owner_raw = await store.client.reads(
        [
            ("ZSCORE", keys.schedule(partition), task_id),
            ("HGET", keys.states(partition, keys.bucket_of(task_id)), task_id),
            ("HMGET", keys.partition_owner(partition), "poller", "until", "inflight"),
        ]
    )
    poller, until, inflight = owner_raw
    owner = partition_owner(poller, until, now)
    # A claim writes nothing per task: a due task of a partition with a claim in flight is
    # being enqueued (a claim token in the state is from a version before ownership).
    due_now = score is not None and float(score) <= now
    claimed = bool(inflight) and due_now
    claimed = claimed or (state is not None and claim_of(state) is not None)
    retries = await _retries(store, partition, task_id)
    (stream_facts,) = await (await store.streams()).queue_infos([task.type])
    stream, stream_complete = await _stream_messages(store, task, stream_facts)
    consumers = _live_consumer_names(stream_facts)
    dead, dead_complete = await _dead_letters(store, task)
    facts: dict[str, Any] = {
        "task_id": task_id,
        "now_ms": now,
        "status": task.status,
        "labels": task.labels,
        "schedule": task.schedule.to_dict(),
        "schedule_text": describe_schedule(task.schedule),
        "next_run_ms": task.next_run_ms,
        "next_run": iso(task.next_run_ms),
        "partition": partition,
        "in_schedule_index": score is not None,
        "index_score_ms": score_ms(score) if score is not None else None,
        "partition_owner": owner,
        "claimed_by_poller": claimed,
        "retries": retries,
        "stream": stream,
        "stream_scan_complete": stream_complete,
        "live_consumers": consumers,
        "dead_letters": dead,
        "dead_letter_scan_complete": dead_complete,
        "fires": task.fires,
        "runs": task.runs,
        "last_run_ms": task.last_run_ms,
        "last_status": task.last_status,
        "last_error": task.last_error,
    }
    facts.update(await note_facts(store, task_id))
    facts["upcoming"] = task_upcoming(task, UPCOMING_SHOWN, now, facts["parked_ms"])["fires"]
    facts.update(await ledger_facts(store, task_id, HISTORY_SHOWN))
    summary = _summary(task, facts, now)
    facts["summary"] = summary[:1] + note_sentences(facts) + ledger_sentences(facts) + summary[1:]
    return facts


async def _retries(store: TaskStore, partition: int, task_id: str) -> list[dict[str, Any]]:
    keys = await store.keys()
    sids: list[str] = []
    cursor = 0
    for _ in range(STREAM_SCAN_CAP // _PAGE):
        cursor, page = await store.client.execute(
            "ZSCAN", keys.retry(partition), cursor, "MATCH", f"{task_id}:*", "COUNT", _PAGE
        )
        sids += [as_text(member) for member, _score in page]
        if int(cursor) == 0:
            break
    prefix = keys.retry_context_prefix(partition)
    contexts = await store.client.reads([("HGETALL", prefix + sid) for sid in sids])
    out = []
    for sid, raw in zip(sids, contexts, strict=True):
        f = {as_text(k): as_text(v) for k, v in (raw or {}).items()}
        out.append(
            {
                "schedule_id": sid,
                "attempt": stored_number(f.get("attempt")) or 0,
                "retry_at_ms": stored_number(f.get("retry_at_ms")),
                "last_error": f.get("last_error"),
            }
        )
    return out


async def _entries_of(
    store: TaskStore, key: str, task_id: str, *, newest_first: bool = False
) -> tuple[list[tuple[str, dict[str, str]]], bool]:
    """The entries of one task in a stream, in scan order, reading at most STREAM_SCAN_CAP
    entries; and whether the scan reached the end."""
    found: list[tuple[str, dict[str, str]]] = []
    start, end = ("+", "-") if newest_first else ("-", "+")
    for _ in range(STREAM_SCAN_CAP // _PAGE):
        streams = await store.streams()
        entries = await streams.read_range(key, start, end, _PAGE, newest_first=newest_first)
        for entry_id, raw in entries:
            fields = {as_text(k): as_text(v) for k, v in flat_fields(raw).items()}
            if fields.get("task_id") == task_id:
                found.append((as_text(entry_id), fields))
        if len(entries) < _PAGE:
            return found, True
        start = f"({as_text(entries[-1][0])}"
    return found, False


async def _stream_messages(
    store: TaskStore, task: Task, stream_facts: list[Any]
) -> tuple[list[dict[str, Any]], bool]:
    keys = await store.keys()
    queue = keys.queue(task.type)
    found, complete = await _entries_of(store, queue, task.task_id)
    return await _with_pending(store, task.type, found, stream_facts), complete


def _schedule_id_of(fields: dict[str, str]) -> str | None:
    """A stream message's schedule_id: a compact message leaves it out (it is always
    task_id:due_ms: ``actors.store.messages``); None for an entry that has neither (one
    written by hand: explain shows it as it is)."""
    if "schedule_id" in fields:
        return fields["schedule_id"]
    due = fields.get("due_ms", "")
    return schedule_id(fields["task_id"], int(due)) if due.isdecimal() else None


async def _with_pending(
    store: TaskStore,
    task_type: str,
    found: list[tuple[str, dict[str, str]]],
    stream_facts: list[Any],
) -> list[dict[str, Any]]:
    """The task's messages still to run or running: an entry the group has delivered and
    that is no longer pending was acknowledged (it stays until the claimers trim it).
    ``stream_facts``: the type's ``Streams.queue_infos`` row."""
    streams = await store.streams()
    pending = await streams.pending_of(task_type, [entry_id for entry_id, _ in found])
    group = our_group(stream_facts[2])
    delivered_up_to = stream_id_key(group["last-delivered-id"]) if group else (0, 0)
    out = []
    for (entry_id, f), info in zip(found, pending, strict=True):
        if info is None and stream_id_key(entry_id) <= delivered_up_to:
            continue  # done: acknowledged
        out.append(
            {
                "msg_id": entry_id,
                "schedule_id": _schedule_id_of(f),
                "attempt": stored_number(f.get("attempt")) or 0,
                "enqueued_ms": stream_id_ms(entry_id),
                "delivered": info is not None,
                "consumer": as_text(info["consumer"]) if info else None,
                "idle_ms": int(info["time_since_delivered"]) if info else None,
                "deliveries": int(info["times_delivered"]) if info else 0,
            }
        )
    return out


def _live_consumer_names(stream_facts: list[Any]) -> list[str]:
    """The consumers of the type's group that read recently (``CONSUMER_GONE_MS``), from
    its ``Streams.queue_infos`` row."""
    consumers = stream_facts[3] if isinstance(stream_facts[3], list) else []
    return [as_text(c["name"]) for c in consumers if int(c["idle"]) < CONSUMER_GONE_MS]


async def _dead_letters(store: TaskStore, task: Task) -> tuple[dict[str, Any], bool]:
    keys = await store.keys()
    found, complete = await _entries_of(store, keys.dlq(task.type), task.task_id, newest_first=True)
    newest = None
    if found:  # its own id wins over a field of that name (another producer's)
        entry_id, fields = found[0]
        newest = {"entry_id": entry_id, **{k: v for k, v in fields.items() if k != "entry_id"}}
    return {"count": len(found), "newest": newest}, complete


def _summary(task: Task, facts: dict[str, Any], now: int) -> list[str]:
    """The explanation as sentences, most important first."""
    lines: list[str] = []
    if task.status == "paused":
        lines.append("paused: it will not fire until resumed (fires in between are skipped)")
    elif task.status == "stopped":
        lines.append("stopped: it will never fire again; delete it or create a new task")
    elif task.status == "finished":
        lines.append(
            "finished: its schedule has no further fires (one-shot done, end passed "
            "or max_runs reached)"
        )
    elif task.next_run_ms is None:
        lines.append("active but without a next fire time: its stored schedule has no future")
    elif not facts["in_schedule_index"]:
        lines.append(
            "active but missing from the schedule index, so no poller will fire it; "
            "update or pause and resume it to re-index it"
        )
    elif facts["claimed_by_poller"]:
        lines.append("claimed by a poller right now: its due fire is being enqueued")
    elif facts["index_score_ms"] < now - OVERDUE_MS:
        # The index score is when the fire is really due (grid time plus its jitter).
        owner = facts["partition_owner"]
        served = (
            f"partition {facts['partition']} is held by poller {owner['poller']}, which is "
            "behind or stuck"
            if owner["live"]
            else f"no poller serves partition {facts['partition']} (check [scheduler] "
            "pollers on your nodes)"
        )
        lines.append(f"overdue by {(now - facts['index_score_ms']) / 1000:.1f}s: {served}")
    elif facts["parked_ms"] is not None and facts["parked_ms"] == task.next_run_ms:
        lines.append(
            f"active: kept due at {facts['next_run']} only to start the fires waiting behind "
            "its fire in flight (no new fire at that time)"
        )
    else:
        due = facts["index_score_ms"]
        jitter = f" (enqueued at {iso(due)})" if due != task.next_run_ms else ""
        lines.append(
            f"active: next fire at {facts['next_run']}{jitter} "
            f"(in {max(0, due - now) / 1000:.1f}s), {facts['schedule_text']}"
        )
    if facts["upcoming"]:
        lines.append("next fires: " + ", ".join(_fire_text(f) for f in facts["upcoming"]))
    for retry in facts["retries"]:  # its attempt counts from 0, as ctx.attempt does
        lines.append(
            f"fire {retry['schedule_id']} waits for retry attempt {retry['attempt']} at "
            f"{iso(retry['retry_at_ms'])} after: {error_line(retry['last_error'])}"
        )
    for msg in facts["stream"]:
        # Attempts count from 0, as in the log lines and the handler's ctx.attempt.
        if msg["delivered"]:
            lines.append(
                f"fire {msg['schedule_id']} attempt {msg['attempt']} is running on "
                f"consumer {msg['consumer']} (idle {msg['idle_ms']} ms, delivered "
                f"{msg['deliveries']} times)"
            )
        elif not facts["live_consumers"]:
            lines.append(
                f"fire {msg['schedule_id']} is queued, waiting "
                f"{(now - msg['enqueued_ms']) / 1000:.1f}s: no consumer of type {task.type} "
                f"is running (no node has a [consumers.{task.type}] section up)"
            )
        else:
            lines.append(
                f"fire {msg['schedule_id']} is queued, waiting "
                f"{(now - msg['enqueued_ms']) / 1000:.1f}s for a consumer of type {task.type} "
                f"({len(facts['live_consumers'])} running)"
            )
    dead = facts["dead_letters"]
    if dead["count"]:
        lines.append(
            f"{dead['count']} dead letter(s) in the {task.type} DLQ; newest: "
            f"{dead['newest'].get('reason')}: {error_line(dead['newest'].get('error'))}"
        )
    if task.last_run_ms is not None:
        lines.append(
            f"last run at {iso(task.last_run_ms)}: {task.last_status}"
            + (f" ({error_line(task.last_error)})" if task.last_error else "")
        )
    else:
        lines.append("has not run yet")
    return lines


def _fire_text(fire: dict[str, Any]) -> str:
    """One upcoming fire in words: its grid time, when it is enqueued if later, and what a
    DST change did to it."""
    text = str(fire["due"])
    if fire["fire_ms"] != fire["due_ms"]:
        text += f" (enqueued {fire['fire']})"
    if fire["note"]:
        text += f" [{fire['note']}]"
    return text
