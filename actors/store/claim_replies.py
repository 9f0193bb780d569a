"""Decoding a poller's claims: ``claim_due.lua``'s reply, and ``read_definitions.lua``'s for
the tasks a claim read without their definitions.

Every fire passes through here once, so decoding is lean: records are read by
``msgpack`` directly with their array headers prefixed (``records.unpack`` inlined),
schedules decoded once per distinct stored form, and a task whose records this version
cannot read is set aside with what is wrong (``PartitionClaim.unreadable``), not raised:
it stays due and the poller says so. Apart from ``replies`` (the values themselves)
because it is the one place that knows the claim's reply layout.

The decoders read the poller's caches (``DefinitionCache.get``, the states ``KnownStates``
kept) and never write them: they return what a claim taught (``LeanClaim.complete``, the
definitions worth keeping), and their caller, ``SchedulingScripts.claim_due``, updates the
caches in one visible place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from msgpack import unpackb

from actors.domain.schedules import Schedule
from actors.store.codes import (
    CLAIM_HEADER,
    CLAIM_ITEMS,
    DEFINITION_VALUES,
    LEAN_CLAIM_ITEMS,
    STATE_FIRES,
    STATE_NEXT_MS,
    STATE_STATUS,
    STATE_UPDATED_MS,
    STATE_VALUES,
    optional_ms,
)
from actors.store.definitions import Definition, DefinitionCache
from actors.store.keys import bucket_hash_of_bytes
from actors.store.records import (
    ARRAY_HEADERS,
    STATUS_NAMES,
    RecordError,
    decode_schedule,
    unpack,
)
from actors.store.replies import Claimed, PartitionClaim

if TYPE_CHECKING:
    from actors.store.known_states import KnownStates

#: A state record's status code for an active task.
ACTIVE = STATUS_NAMES.index("active")
INACTIVE = frozenset(STATUS_NAMES.index(name) for name in ("paused", "stopped", "finished"))

#: Many tasks share a few distinct schedules: decode each stored form once.
_SCHEDULES: dict[bytes, Schedule] = {}


def _schedule(raw: bytes) -> Schedule:
    schedule = _SCHEDULES.get(raw)
    if schedule is None:
        if len(_SCHEDULES) > 10_000:
            _SCHEDULES.clear()
        schedule = _SCHEDULES[raw] = decode_schedule(raw)
    return schedule


_DEFINITION, _STATE = ARRAY_HEADERS[DEFINITION_VALUES], ARRAY_HEADERS[STATE_VALUES]
#: What decoding records that are not a task's (of another version, or hand-written) raises.
_UNDECODABLE = (RecordError, ValueError, TypeError, AttributeError, IndexError)


#: A due task with a state record and no definition record (``claim_due.lua`` hands an
#: empty one; ``read_definitions.lua`` none): nothing to fire, so it is named, not
#: claimed, and stays in the schedule, looked at again ``UNREADABLE_AGAIN_MS`` on
#: (``Scripts.defer_unreadable``).
NO_DEFINITION = (
    "a state record without a definition record (a partial delete or restore): restore "
    "the definition, or delete the task"
)


def _what_is_wrong(definition: bytes | None, state: bytes, exc: Exception) -> str:
    """Why a claimed task's records (its state alone: None) did not decode, as
    ``records.unpack`` says it."""
    if definition == b"":
        return NO_DEFINITION
    try:
        if definition is not None:
            unpack(definition, DEFINITION_VALUES)
        unpack(state, STATE_VALUES)
    except RecordError as named:
        return str(named)
    return f"records not of a Metronome task: {exc!r}"


def claimed_task(
    task_id: str, bucket: int, definition: Definition, values: list[Any], owed_ms: int,
    prior_claim: str, owed_version: int | None = None, owed_from_ms: int | None = None,
) -> Claimed:  # fmt: skip
    """A claimed task from its definition and its state record's values. Its grid times
    up to ``owed_ms`` are owed (a dead poller's claim may have blocked them) only if it
    was written before the takeover (its version at most ``owed_version``, the last one
    given then; None: unknown, taken as so): a task created, updated or resumed since was
    never held by that claim, and its misfire policy applies. ``owed_from_ms``: when the
    old owner last renewed its lease (``tick_plan.plan_fire`` reads it)."""
    due_ms, version, fires = (
        values[STATE_NEXT_MS],
        values[STATE_UPDATED_MS] or 0,
        values[STATE_FIRES],
    )
    if type(due_ms) is not int or type(version) is not int or type(fires) is not int:
        # written by hand or by something else: said as unreadable, never a crashed tick
        raise RecordError(
            f"state record: next_ms, updated_ms and fires must be whole numbers, "
            f"not {due_ms!r}, {version!r}, {fires!r}"
        )
    if values[STATE_STATUS] != ACTIVE:  # a code no version writes: never fired as active
        raise RecordError(f"state record: status {values[STATE_STATUS]!r} is none this version has")
    owed: int | None = owed_ms
    if owed_ms < due_ms or (owed_version is not None and version > owed_version):
        owed = owed_from_ms = None
    return Claimed(
        task_id, bucket, definition.type, definition.payload, definition.schedule, due_ms,
        fires, version, owed, prior_claim, values, definition.created_ms, owed_from_ms,
    )  # fmt: skip


def decode_definition(raw: bytes) -> Definition:
    """A definition record as a poller uses it (raises as ``unpackb`` does). Its payload
    must be a string (the JSON text): any other value would be refused by the enqueue's
    XADD after the fires before it in the call were appended, a call sent again and again."""
    task_type, payload, sched, created = unpackb(_DEFINITION + raw, raw=True)
    if type(payload) is not bytes:
        raise RecordError(f"definition record: the payload must be JSON text, not {payload!r:.40}")
    return Definition(
        task_type.decode(), payload, _schedule(sched), created if type(created) is int else 0
    )


def decode_state(raw: bytes) -> list[Any]:
    """A state record's values (raises as ``unpackb`` does)."""
    values: list[Any] = unpackb(_STATE + raw, raw=True)
    return values


@attrs.define
class LeanClaim:
    """A claim read without definitions: ``claim`` holds the tasks whose definition the
    cache had; ``misses`` (id, bucket, state values) are the others, to read next (the
    values None where the claim left the states out and the poller did not know it)."""

    claim: PartitionClaim
    misses: list[tuple[str, int, list[Any] | None]]
    owed_ms: int
    prior_claim: str
    complete: bool | None = None
    """Whether every due task's state was one the poller knew (``KnownStates.completed``);
    None when nothing was due (a claim of nothing due tells nothing)."""
    owed_version: int | None = None
    """The partition's last task version at its takeover (``claimed_task``)."""
    owed_from_ms: int | None = None
    """When the partition's old owner last renewed its lease (``claimed_task``)."""


def decode_lean_claim(
    partition: int, reply: list[Any], buckets: int, definitions: DefinitionCache,
    states: KnownStates | None = None,
) -> LeanClaim:  # fmt: skip
    """``claim_due.lua``'s reply without definitions (ARGV[9] ``FLAG_ON``): the tasks whose
    definition at their version ``definitions`` has (and, if the claim left the states
    out, whose state ``states`` knows at the count of writes the claim read), and the
    others (read next with ``read_definitions.lua``, then ``add_read_definitions``).
    Reads the caches, writes neither."""
    header = reply[:CLAIM_HEADER]
    now, earliest, held, prior, owed, writes, with_states, owed_v, owed_from = header
    prior_claim, owed_ms, owed_version = prior.decode(), int(owed), _version(owed_v)
    owed_from_ms = optional_ms(owed_from)
    if int(held):
        held_claim = PartitionClaim(partition, int(now), None, [], holder=prior_claim)
        return LeanClaim(held_claim, [], owed_ms, prior_claim)
    tasks: list[Claimed] = []
    misses: list[tuple[str, int, list[Any] | None]] = []
    unreadable: list[tuple[str, str]] = []
    known_states = states.kept_at(partition, int(writes)) if states is not None else {}
    known = 0
    left_out = not int(with_states)
    for i in range(CLAIM_HEADER, len(reply), LEAN_CLAIM_ITEMS):
        raw_id, state = reply[i], reply[i + 1]
        task_id = raw_id.decode()
        bucket = bucket_hash_of_bytes(raw_id) % buckets
        if left_out:  # ``state`` is the score: the state is the one this poller committed
            entry = known_states.get(task_id)
            if entry is None or entry[0] != float(state):
                misses.append((task_id, bucket, None))
                continue
            values = entry[1]
            known += 1
        else:
            try:
                values = unpackb(_STATE + state, raw=True)
            except _UNDECODABLE as exc:
                unreadable.append((task_id, _what_is_wrong(None, state, exc)))
                continue
            if task_id in known_states:
                known += 1
        definition = definitions.get(partition, task_id, values[STATE_UPDATED_MS] or 0)
        if definition is None:
            misses.append((task_id, bucket, values))
            continue
        try:
            task = claimed_task(
                task_id, bucket, definition, values, owed_ms, prior_claim, owed_version,
                owed_from_ms,
            )  # fmt: skip
            tasks.append(task)
        except _UNDECODABLE as exc:
            unreadable.append((task_id, _what_is_wrong(None, state, exc)))
    due = (len(reply) - CLAIM_HEADER) // LEAN_CLAIM_ITEMS
    claim = PartitionClaim(
        partition, int(now), optional_ms(earliest), tasks, writes=int(writes),
        unreadable=unreadable,
    )  # fmt: skip
    complete = known == due if due else None
    return LeanClaim(claim, misses, owed_ms, prior_claim, complete, owed_version, owed_from_ms)


def add_read_definitions(lean: LeanClaim, reply: list[Any]) -> list[tuple[str, int, Definition]]:
    """``read_definitions.lua``'s reply for ``lean.misses`` (their records, then the
    partition's count of writes): each task whose version is still the claimed one joins
    the claim's tasks; a task changed or deleted since its claim is left out (it stays as
    that write left it, due again next tick if it is due), one whose records do not decode
    goes to ``unreadable``. A task claimed without its state is taken as read if no write
    came between (the count is the claim's) and it is active, as the claim would have
    checked. Returns (task id, version, definition) of the definitions read that fire
    again soon enough to be worth keeping: the caller keeps them."""
    claim = lean.claim
    keep: list[tuple[str, int, Definition]] = []
    unchanged = int(reply[-1] or 0) == claim.writes
    for (task_id, bucket, claimed), raw_def, raw_state in zip(
        lean.misses, reply[:-1:2], reply[1:-1:2], strict=True
    ):
        if raw_state is None:
            continue  # deleted since its claim
        if raw_def is None:  # named as the claim that reads definitions names it
            try:
                values = decode_state(raw_state)
            except _UNDECODABLE as exc:
                claim.unreadable.append((task_id, _what_is_wrong(None, raw_state, exc)))
                continue
            # a stale schedule entry, as claim_due.lua drops one: a known inactive status,
            # or active with no next time; any other state is named
            status = values[STATE_STATUS]
            stale = status in INACTIVE or (status == ACTIVE and values[STATE_NEXT_MS] is None)
            if not stale:
                claim.unreadable.append((task_id, NO_DEFINITION))
            continue
        try:
            definition = decode_definition(raw_def)
            values = decode_state(raw_state)
            if claimed is None:
                if not unchanged or values[STATE_STATUS] != ACTIVE or values[STATE_NEXT_MS] is None:
                    continue
            elif (values[STATE_UPDATED_MS] or 0) != (claimed[STATE_UPDATED_MS] or 0):
                continue
            else:
                values = claimed
            task = claimed_task(
                task_id, bucket, definition, values, lean.owed_ms, lean.prior_claim,
                lean.owed_version, lean.owed_from_ms,
            )  # fmt: skip
        except _UNDECODABLE as exc:
            claim.unreadable.append((task_id, _what_is_wrong(raw_def, raw_state, exc)))
            continue
        if DefinitionCache.worth_keeping(definition, task.due_ms):
            keep.append((task_id, task.updated_ms, definition))
        claim.tasks.append(task)
    return keep


def decode_partition_claim(partition: int, reply: list[Any], buckets: int) -> PartitionClaim:
    """``claim_due.lua``'s reply for one partition. The script hands each task's two
    records back as stored and they are decoded here (Redis's CPU is the scarce one). A
    task whose records this version cannot read is left out (``PartitionClaim.unreadable``):
    it stays due, and the poller says so."""
    now, earliest, held, prior, owed, writes, _, owed_v, owed_from = reply[:CLAIM_HEADER]
    prior_claim, owed_ms, owed_version = prior.decode(), int(owed), _version(owed_v)
    owed_from_ms = optional_ms(owed_from)
    tasks = []
    unreadable: list[tuple[str, str]] = []
    for i in range(CLAIM_HEADER, len(reply), CLAIM_ITEMS):
        raw_id, definition, state = reply[i : i + CLAIM_ITEMS]
        task_id = raw_id.decode()
        bucket = bucket_hash_of_bytes(raw_id) % buckets
        try:  # records.unpack, inlined: this runs for every fire
            values = unpackb(_STATE + state, raw=True)
            tasks.append(
                claimed_task(task_id, bucket, decode_definition(definition), values, owed_ms,
                             prior_claim, owed_version, owed_from_ms)
            )  # fmt: skip
        except _UNDECODABLE as exc:
            unreadable.append((task_id, _what_is_wrong(definition, state, exc)))
    if int(held):
        return PartitionClaim(partition, int(now), None, [], holder=prior_claim)
    return PartitionClaim(
        partition, int(now), optional_ms(earliest), tasks, writes=int(writes),
        unreadable=unreadable,
    )  # fmt: skip


def _version(raw: bytes | str | None) -> int | None:
    """The owed version of a claim's header: None when unknown (a claim script of an
    earlier version took the partition over)."""
    return int(raw) if raw else None
