"""Operators' actions over selected tasks: what one is (``ActionSpec``), its record and
lease in Redis, and its progress as the partitions' marks say.

An action (pause, resume, stop, trigger, delete or backfill the tasks a selector matches)
is recorded before anything is applied (``{ns:actions}:action:<id>``: the spec, the key
that asked, its state and the lease of the node applying it), with its id in the open set
(``{ns:actions}:open``) until it is done. Each partition's progress lives in the
partition's slot (``{ns:P}:action:<id>``), written by the same script as the batch it
counts (``action_batch.lua``). So whoever holds the lease (the node that took the request,
a repeated request with the same id, or a node's resumer once the lease ran out) applies
what the marks say is left, and nothing twice. Records, marks and the trigger's markers
are kept ``RETENTION_MS``.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from actors.domain.errors import InvalidTask
from actors.domain.schedules import MAX_MS, Overlap
from actors.store.notes import check_note
from actors.store.records import RecordError
from actors.store.selection import Selector

if TYPE_CHECKING:
    from actors.store.tasks import TaskStore

ACTIONS = ("pause", "resume", "stop", "trigger", "delete", "backfill")
#: How long an action's record, marks and markers are kept (its id cannot be used again
#: for another action meanwhile).
RETENTION_MS = 7 * 86_400_000
#: Failures kept per partition and shown in all (the rest are counted).
MAX_FAILURES = 100
#: Action states.
APPLYING, DONE = "applying", "done"


@attrs.frozen
class ActionSpec:
    """What an action does: checked here, stored as JSON with its record."""

    action: str
    selector: Selector
    note: str | None = None
    """Kept with each task a pause or resume changes."""
    overlap: str | None = None
    """A trigger's or backfill's policy (as the single-task endpoints take it)."""
    start_ms: int | None = None
    end_ms: int | None = None
    """A backfill's window."""

    def __attrs_post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise InvalidTask(f"action: must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.note is not None:
            if self.action not in ("pause", "resume"):
                raise InvalidTask("note: only a pause or a resume keeps a note")
            check_note(self.note)
        if self.overlap is not None:
            if self.action not in ("trigger", "backfill"):
                raise InvalidTask("overlap: only a trigger or a backfill takes an overlap policy")
            if self.overlap not in typing.get_args(Overlap):
                allowed = ", ".join(typing.get_args(Overlap))
                raise InvalidTask(f"overlap: must be one of {allowed}, got {self.overlap!r}")
        window = (self.start_ms, self.end_ms)
        if self.action != "backfill":
            if window != (None, None):
                raise InvalidTask("start_ms: only a backfill takes a window (start_ms, end_ms)")
            return
        for name, value in zip(("start_ms", "end_ms"), window, strict=True):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_MS:
                raise InvalidTask(f"{name}: a backfill needs Unix ms within 0..{MAX_MS}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"action": self.action, "selector": self.selector.to_dict()}
        for name in ("note", "overlap", "start_ms", "end_ms"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActionSpec:
        return cls(
            data["action"], Selector.from_dict(data["selector"]), data.get("note"),
            data.get("overlap"), data.get("start_ms"), data.get("end_ms"),
        )  # fmt: skip


@attrs.frozen
class Progress:
    """One partition's mark (``action_batch.lua``)."""

    last: str = ""
    changed: int = 0
    unchanged: int = 0
    failed: int = 0
    failures: tuple[tuple[str, str], ...] = ()
    done: bool = False

    @classmethod
    def decode(cls, raw: Mapping[bytes, bytes] | None) -> Progress:
        if not raw:
            return cls()
        fields = {k.decode(): v.decode(errors="replace") for k, v in raw.items()}
        failures = tuple(
            (line.partition(" ")[0], line.partition(" ")[2])
            for line in fields.get("failures", "").splitlines()
            if line
        )
        return cls(
            fields.get("last", ""), int(fields.get("changed", 0)),
            int(fields.get("unchanged", 0)), int(fields.get("failed", 0)), failures,
            fields.get("done") == "1",
        )  # fmt: skip


@attrs.frozen
class ActionState:
    """An action as Redis has it: its record and every partition's mark."""

    action_id: str
    spec: ActionSpec
    key_id: str | None
    created_ms: int
    state: str
    holder: str
    lease_until_ms: int | None
    done_ms: int | None
    progress: tuple[Progress, ...]

    def counts(self) -> dict[str, Any]:
        """The answer's counts: tasks processed (matched when their partition was
        applied), changed, unchanged, failed (the first ``MAX_FAILURES`` by id)."""
        p = self.progress
        changed, unchanged = sum(x.changed for x in p), sum(x.unchanged for x in p)
        failed = sum(x.failed for x in p)
        shown = [{"task_id": t, "reason": r} for x in p for t, r in x.failures][:MAX_FAILURES]
        return {
            "count": changed + unchanged + failed, "changed": changed, "unchanged": unchanged,
            "failed": shown, "failed_count": failed,
        }  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """``GET /v1/tasks/actions/{action_id}``."""
        return {
            "action_id": self.action_id,
            **self.spec.to_dict(),
            "key_id": self.key_id,
            "state": self.state,
            "done": self.state == DONE,
            "created_ms": self.created_ms,
            "done_ms": self.done_ms,
            "lease_until_ms": self.lease_until_ms if self.state == APPLYING else None,
            "partitions": len(self.progress),
            "partitions_done": sum(p.done for p in self.progress),
            **self.counts(),
        }


async def read_action(store: TaskStore, action_id: str) -> ActionState | None:
    """The action's record and marks, or None when there is no such action (or it is
    older than ``RETENTION_MS``); ``RecordError`` when they cannot be read. Two round
    trips."""
    keys = await store.keys()
    raw = await store.client.execute("HGETALL", keys.action_record(action_id))
    if not raw:
        return None
    marks = await store.client.reads(
        [("HGETALL", keys.action_progress(p, action_id)) for p in range(keys.partitions)]
    )
    try:
        return _decode_action(action_id, raw, marks)
    except Exception as exc:  # a record an older version or another program wrote
        raise unreadable_action(action_id, exc) from exc


def unreadable_action(action_id: str, exc: Exception) -> RecordError:
    """What an action whose stored record this version cannot read is said as."""
    return RecordError(
        f"action {action_id!r}: its stored record is not one this version reads: {exc!r}"
    )


def _decode_action(
    action_id: str, raw: Mapping[bytes, bytes], marks: list[Mapping[bytes, bytes]]
) -> ActionState:
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    until, done = fields.get("until"), fields.get("done_ms")
    return ActionState(
        action_id, ActionSpec.from_dict(json.loads(fields["spec"])), fields.get("key_id") or None,
        int(fields.get("created_ms", 0)), fields.get("state", APPLYING), fields.get("holder", ""),
        int(until) if until else None, int(done) if done else None,
        tuple(Progress.decode(m) for m in marks),
    )  # fmt: skip


async def create_action(
    store: TaskStore, action_id: str, spec: ActionSpec, key_id: str | None, holder: str,
    lease_ms: int,
) -> str | None:  # fmt: skip
    """Record the action, its lease held by ``holder``; None when recorded now, else the
    spec (JSON) an action of this id was recorded with."""
    scripts = await store.scripts()
    reply = await scripts.action_lease(
        action_id, "create", holder, lease_ms, RETENTION_MS, spec.to_json(), key_id or "",
        await store.client.time_ms(),
    )  # fmt: skip
    return None if int(reply[0]) == 1 else str(reply[1])


async def take_lease(
    store: TaskStore, action_id: str, holder: str, lease_ms: int, gone: str = ""
) -> bool:
    """Take the action's lease: when it ran out, or is held by ``gone`` (a holder seen to
    have exited) or by ``holder`` already. False when another holds it or it is done."""
    scripts = await store.scripts()
    reply = await scripts.action_lease(action_id, "take", holder, lease_ms, RETENTION_MS, gone)
    return int(reply[0]) == 1


async def renew_lease(store: TaskStore, action_id: str, holder: str, lease_ms: int) -> bool:
    scripts = await store.scripts()
    reply = await scripts.action_lease(action_id, "renew", holder, lease_ms, RETENTION_MS)
    return int(reply[0]) == 1


async def finish_action(store: TaskStore, action_id: str, holder: str) -> bool:
    """Mark the action done (out of the open set); False when ``holder`` no longer held it."""
    scripts = await store.scripts()
    reply = await scripts.action_lease(action_id, "finish", holder, 0, RETENTION_MS)
    return int(reply[0]) == 1


async def open_actions(store: TaskStore, limit: int = 100) -> list[tuple[str, str, int]]:
    """Actions not done: (action_id, holder, lease end ms), earliest lease end first."""
    keys = await store.keys()
    members = await store.client.execute("ZRANGE", keys.actions_open, 0, limit - 1, "WITHSCORES")
    # a lease end no script writes (another program's inf) counts as run out
    found = [
        (m.decode(errors="replace"), int(float(s)) if math.isfinite(float(s)) else 0)
        for m, s in members
    ]
    if not found:
        return []
    holders = await store.client.pipeline(
        [("HGET", keys.action_record(action_id), "holder") for action_id, _ in found]
    )
    return [
        (action_id, h.decode(errors="replace") if isinstance(h, bytes) else "", until)
        for (action_id, until), h in zip(found, holders, strict=True)
    ]
