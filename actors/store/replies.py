"""The typed values that go into and come out of ``actors.store.scripts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from msgpack import unpackb

from actors.domain.schedules import Schedule
from actors.store.codes import optional_ms
from actors.store.definitions import Definition, DefinitionCache
from actors.store.keys import bucket_hash_of_bytes
from actors.store.messages import Message
from actors.store.records import (
    ARRAY_HEADERS,
    DEFINITION_VALUES,
    STATE_VALUES,
    STATUS_NAMES,
    RecordError,
    advanced_values,
    decode_schedule,
    pack_values,
    unpack,
)

if TYPE_CHECKING:
    from actors.store.known_states import KnownStates

#: A state record's status code for an active task.
ACTIVE = STATUS_NAMES.index("active")


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class Fire:
    """One fire to append to its type's stream."""

    task_id: str
    type: str
    payload: bytes | str
    due_ms: int
    attempt: int = 0
    prior: str = ""
    """The token of an earlier claim of this fire that was never committed (its poller or
    dispatcher died): what it appended is not appended again (``enqueue.lua``)."""
    policy: str = ""
    """Its task's policy code (``actors.store.flights.policy_code``), '' for none."""
    fresh: bool = True
    """False for a fire an earlier claim put in flight (``overlap.lua``): if the enqueue
    finds it appended already, that copy is the one in flight."""


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class Claimed:
    """One task claimed for this tick, as ``claim_due.lua`` returns it."""

    task_id: str
    bucket: int
    type: str
    payload: bytes
    schedule: Schedule
    due_ms: int
    fires: int
    updated_ms: int = 0
    """The task's version when claimed: the commit is refused if an API write moved it."""
    owed_until_ms: int | None = None
    """Its partition was taken over from a poller that died (or let it go) holding it
    until then, and this grid time came before: the grid times due meanwhile are owed
    fires (``plan_fires(owed_until_ms=...)``)."""
    prior_claim: str = ""
    """Tokens of earlier claims of its partition that were never committed, space
    separated ('' when none): their fires may be in the stream already (``Fire.prior``)."""
    state: list[Any] = attrs.field(factory=list)
    """The state record's values as claimed (``records.STATE_VALUES`` of them): the commit
    writes them back with the grid moved on."""


#: Many tasks share a few distinct schedules: decode each stored form once.
_SCHEDULES: dict[bytes, Schedule] = {}


def _schedule(raw: bytes) -> Schedule:
    schedule = _SCHEDULES.get(raw)
    if schedule is None:
        if len(_SCHEDULES) > 10_000:
            _SCHEDULES.clear()
        schedule = _SCHEDULES[raw] = decode_schedule(raw)
    return schedule


#: Items per task in ``claim_due.lua``'s reply, after its header of ``CLAIM_HEADER``.
CLAIM_ITEMS = 3
CLAIM_HEADER = 7


_DEFINITION, _STATE = ARRAY_HEADERS[DEFINITION_VALUES], ARRAY_HEADERS[STATE_VALUES]
#: What decoding records that are not a task's (of another version, or hand-written) raises.
_UNDECODABLE = (RecordError, ValueError, TypeError, AttributeError, IndexError)


def _what_is_wrong(definition: bytes | None, state: bytes, exc: Exception) -> str:
    """Why a claimed task's records (its state alone: None) did not decode, as
    ``records.unpack`` says it."""
    try:
        if definition is not None:
            unpack(definition, DEFINITION_VALUES)
        unpack(state, STATE_VALUES)
    except RecordError as named:
        return str(named)
    return f"records not of a Metronome task: {exc!r}"


def claimed_task(
    task_id: str, bucket: int, definition: Definition, values: list[Any], owed_ms: int,
    prior_claim: str,
) -> Claimed:  # fmt: skip
    """A claimed task from its definition and its state record's values."""
    due_ms = values[1]
    return Claimed(
        task_id, bucket, definition.type, definition.payload, definition.schedule, due_ms,
        values[2], values[3] or 0, owed_ms if owed_ms >= due_ms else None, prior_claim,
        values,
    )  # fmt: skip


def decode_definition(raw: bytes) -> Definition:
    """A definition record as a poller uses it (raises as ``unpackb`` does)."""
    task_type, payload, sched, _ = unpackb(_DEFINITION + raw, raw=True)
    return Definition(task_type.decode(), payload, _schedule(sched))


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


def decode_lean_claim(
    partition: int, reply: list[Any], buckets: int, definitions: DefinitionCache,
    states: KnownStates | None = None,
) -> LeanClaim:  # fmt: skip
    """``claim_due.lua``'s reply without definitions (ARGV[9] '1'): the tasks whose
    definition at their version ``definitions`` has (and, if the claim left the states
    out, whose state ``states`` knows), and the others (read next with
    ``read_definitions.lua``, then ``add_read_definitions``)."""
    now, earliest, held, prior, owed, writes, with_states = reply[:CLAIM_HEADER]
    prior_claim, owed_ms = prior.decode(), int(owed)
    if int(held):
        held_claim = PartitionClaim(partition, int(now), None, [], holder=prior_claim)
        return LeanClaim(held_claim, [], owed_ms, prior_claim)
    tasks: list[Claimed] = []
    misses: list[tuple[str, int, list[Any] | None]] = []
    unreadable: list[tuple[str, str]] = []
    if states is not None:
        states.claimed(partition, int(writes))
    known_states = states.of(partition) if states is not None else {}
    known = 0
    left_out = not int(with_states)
    for i in range(CLAIM_HEADER, len(reply), 2):
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
        definition = definitions.get(partition, task_id, values[3] or 0)
        if definition is None:
            misses.append((task_id, bucket, values))
        else:
            tasks.append(claimed_task(task_id, bucket, definition, values, owed_ms, prior_claim))
    due = (len(reply) - CLAIM_HEADER) // 2
    if states is not None and due:  # a claim of nothing due tells nothing
        states.completed(partition, known == due)
    claim = PartitionClaim(
        partition, int(now), optional_ms(earliest), tasks, writes=int(writes),
        unreadable=unreadable,
    )  # fmt: skip
    return LeanClaim(claim, misses, owed_ms, prior_claim)


def add_read_definitions(lean: LeanClaim, reply: list[Any], definitions: DefinitionCache) -> None:
    """``read_definitions.lua``'s reply for ``lean.misses`` (their records, then the
    partition's count of writes): each task whose version is still the claimed one joins
    the claim's tasks (and ``definitions``, if it fires again soon enough to be worth
    keeping); a task changed or deleted since its claim is left out (it stays as that
    write left it, due again next tick if it is due), one whose records do not decode goes
    to ``unreadable``. A task claimed without its state is taken as read if no write came
    between (the count is the claim's) and it is active, as the claim would have checked."""
    claim = lean.claim
    unchanged = int(reply[-1] or 0) == claim.writes
    for (task_id, bucket, claimed), raw_def, raw_state in zip(
        lean.misses, reply[:-1:2], reply[1:-1:2], strict=True
    ):
        if raw_def is None or raw_state is None:
            continue
        try:
            definition = decode_definition(raw_def)
            values = decode_state(raw_state)
        except _UNDECODABLE as exc:
            claim.unreadable.append((task_id, _what_is_wrong(raw_def, raw_state, exc)))
            continue
        if claimed is None:
            if not unchanged or values[0] != ACTIVE or values[1] is None:
                continue
        elif (values[3] or 0) != (claimed[3] or 0):
            continue
        else:
            values = claimed
        if definitions.worth_keeping(definition, values[1]):
            definitions.put(claim.partition, task_id, values[3] or 0, definition)
        claim.tasks.append(
            claimed_task(task_id, bucket, definition, values, lean.owed_ms, lean.prior_claim)
        )


def decode_partition_claim(partition: int, reply: list[Any], buckets: int) -> PartitionClaim:
    """``claim_due.lua``'s reply for one partition. The script hands each task's two
    records back as stored and they are decoded here (Redis's CPU is the scarce one). A
    task whose records this version cannot read is left out (``PartitionClaim.unreadable``):
    it stays due, and the poller says so."""
    now, earliest, held, prior, owed, writes, _ = reply[:CLAIM_HEADER]
    prior_claim = prior.decode()
    owed_ms = int(owed)
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
                             prior_claim)
            )  # fmt: skip
        except _UNDECODABLE as exc:
            unreadable.append((task_id, _what_is_wrong(definition, state, exc)))
    if int(held):
        return PartitionClaim(partition, int(now), None, [], holder=prior_claim)
    return PartitionClaim(
        partition, int(now), optional_ms(earliest), tasks, writes=int(writes),
        unreadable=unreadable,
    )  # fmt: skip


@attrs.frozen
class PartitionClaim:
    partition: int
    now_ms: int
    earliest_ms: int | None
    tasks: list[Claimed]
    holder: str = ""
    """The poller whose lease on the partition holds ('' when it is this one's): nothing
    was claimed."""
    writes: int = 0
    """The partition's count of API writes when claimed (``commit_fires`` checks each task
    only if it moved)."""
    unreadable: list[tuple[str, str]] = attrs.field(factory=list)
    """(task id, what is wrong) of due tasks whose records this version cannot read:
    not claimed, left due as they are."""

    @property
    def held(self) -> bool:
        return bool(self.holder)


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class FireCommit:
    """Where a claimed task's grid goes (``fire_commit`` builds it)."""

    task_id: str
    bucket: int
    score: int | None
    """Its next score in the schedule; None when it never fires again (finished)."""
    due_ms: int
    """The grid time claimed: the commit is refused if it moved, or the task's version
    (``Claimed.updated_ms``, carried unchanged in ``state``)."""
    state: bytes
    """The new state record (``records.advanced_values``, packed): what the commit writes."""
    values: list[Any] = attrs.field(factory=list)
    """``state``'s values: what the poller knows the task's state to be once committed
    (``actors.store.known_states``)."""
    confirm: bool = False
    """The claim put one of the task's fires in flight (``overlap.lua``): the commit
    confirms it was appended."""
    misfire: tuple[int, str, int] | None = None
    """The claim found grid times missed: (the history fate standing for them, coalesced
    or skipped; the task's type; the history's length), recorded by the commit."""


def fire_commit(task: Claimed, next_ms: int | None, score: int | None, fired: int) -> FireCommit:
    """The commit of a claimed task: its grid moves to ``next_ms`` (None: finished) at
    ``score`` (None exactly when ``next_ms`` is), with ``fired`` fires enqueued."""
    values = advanced_values(task.state, next_ms, fired)
    return FireCommit(task.task_id, task.bucket, score, task.due_ms, pack_values(values), values)


@attrs.frozen
class Commit:
    earliest_ms: int | None
    """The partition's earliest score after the commit."""
    lost: list[str]
    """Tasks (or retries) whose claim was no longer ours: nothing was committed for them."""


@attrs.frozen
class RetryClaim:
    partition: int
    now_ms: int
    earliest_ms: int | None
    retries: list[tuple[str, Fire]]
    """(schedule_id, the fire to enqueue again)."""


@attrs.frozen
class RetryWrite:
    """A failed fire to retry ``delay_ms`` from now on Redis's clock (attempt = the
    message's + 1)."""

    message: Message
    delay_ms: int
    error: str


@attrs.define  # not frozen: built per fire, and a frozen class costs ~4x to build
class OutcomeWrite:
    """A fire's outcome for its task's run record and history: ``outcome`` is an index
    of ``records.OUTCOME_NAMES``, or 3 (cancelled) / 4 (expired): not run, history only."""

    task_id: str
    outcome: int
    finished_ms: int
    error: str
    due_ms: int = 0
    started_ms: int | None = None
    attempt: int = 0
    origin: int = 0
    """``actors.store.history.ORIGINS`` index."""
    line: str = ""
    """The error's last line (history)."""


@attrs.frozen
class DeadLetterWrite:
    """A message to move to its type's DLQ, with the fields of its DLQ entry."""

    msg_id: str
    fields: Mapping[Any, Any]
    """Bytes keys and values only for an entry that was not a Metronome message: kept as
    it was."""


@attrs.frozen
class Reclaimed:
    msg_id: str
    owner: str
    idle_ms: int
    deliveries: int
    fields: dict[bytes, bytes]


@attrs.frozen
class Reclaim:
    claimed: list[Reclaimed]
    poisoned: list[str]
    stalled: bool = False
    """The call reached Redis later than ``max_delay_ms`` after it was sent (Redis was
    paused or stalled meanwhile): it took nothing, since the holders' renewals were held
    up too."""
    now_ms: int = 0
    """Redis's time as the call ran, on the stream's own server."""
    ended: list[Any] = attrs.field(factory=list)
    """The flights of poisoned messages of tasks with a policy (``FlightEnd``s)."""


@attrs.frozen
class TaskRow:
    """A task to create: its stored schedule and first grid time (None: never fires)."""

    task_id: str
    type: str
    payload_json: str
    sched: bytes
    next_ms: int | None
    score: int | None
    labels_json: str = ""
    """Its labels as stored ('' = none: nothing is written)."""
