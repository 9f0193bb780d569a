"""The typed values that go into and come out of ``actors.store.scripts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import msgpack

from actors.domain.schedules import Schedule
from actors.store.codes import ENTRY_FIELDS
from actors.store.messages import Message
from actors.store.records import (
    advanced_values,
    pack_values,
)

if TYPE_CHECKING:
    pass


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
    created_ms: int = 0
    """The task's creation version (``Definition.created_ms``)."""
    owed_from_ms: int | None = None
    """With ``owed_until_ms``: when the old owner last took or renewed its lease (no claim
    before it read a task written after it: ``tick_plan.plan_fire``); None when unknown."""


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
    """The task has an overlap policy and the claim decided its fires (``overlap.lua``):
    the commit confirms what that put in flight was appended, and keeps the task
    scheduled, parked, should the grid end while its flight holds fires
    (``commit_fires.lua``)."""
    parked: bool = False
    """Its claim parked it (its grid ended with fires waiting behind its fire in flight):
    the commit marks its next time counted (``mark_parked`` in ``lua/flight.lua``)."""
    misfire: tuple[int, str, int] | None = None
    """The claim found grid times missed: (the history fate standing for them, coalesced
    or skipped; the task's type; the history's length), recorded by the commit."""
    hold_ms: int = 0
    """> 0: the task's fires were not appended (Redis rejects its type's stream): its grid
    and state stay as claimed, and its score moves this long past the commit's time, on
    Redis's clock (``held_commit``)."""
    keep: bool = False
    """With ``hold_ms``: the claim stays in flight (its type needed several enqueue calls,
    and one may have gone through: the task's next claim must find what it appended)."""


def fire_commit(task: Claimed, next_ms: int | None, score: int | None, fired: int) -> FireCommit:
    """The commit of a claimed task: its grid moves to ``next_ms`` (None: finished) at
    ``score`` (None exactly when ``next_ms`` is), with ``fired`` fires enqueued."""
    values = advanced_values(task.state, next_ms, fired)
    return FireCommit(task.task_id, task.bucket, score, task.due_ms, pack_values(values), values)


def held_commit(task: Claimed, hold_ms: int, keep: bool = False) -> FireCommit:
    """The commit of a claimed task whose fires Redis would not take (its type's stream
    rejected): nothing of it moves but its score, ``hold_ms`` on, so the partition's next
    claims take its other tasks, and this one is claimed again (its grid time planned
    again) after that."""
    if hold_ms <= 0:  # a score of None alone would take the task out of the schedule
        raise ValueError(f"hold_ms must be positive, got {hold_ms}")
    return FireCommit(
        task.task_id, task.bucket, None, task.due_ms, pack_values(task.state), task.state,
        hold_ms=hold_ms, keep=keep,
    )  # fmt: skip


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
    dropped: list[str] = attrs.field(factory=list)
    """Schedule ids whose retry was dropped: their task was deleted or stopped since."""
    unreadable: list[str] = attrs.field(factory=list)
    """Schedule ids whose retry context this version cannot run (left as they are)."""


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
    """The error's line that says what happened (history: ``queue_rows.error_line``)."""
    allowed_ms: int | None = None
    """The lateness the fire was allowed (its task's spread and jitter), or None when its
    start is not judged late or on time (a retry, a manual fire)."""


@attrs.frozen
class DeadLetterWrite:
    """A message to move to its type's DLQ, with the fields of its DLQ entry."""

    msg_id: str
    fields: Mapping[Any, Any]
    """Bytes keys and values only for an entry that was not a Metronome message: kept as
    it was (``folded`` when it has more fields than a script can pass on)."""


def folded(fields: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """``fields`` as a dead letter carries them: past ``ENTRY_FIELDS`` (another program's
    entry), the first ones, and the rest in one field, ``folded`` (MessagePack of their
    flat list, as ``reclaim.lua`` folds a poison entry's), so the dead letter can be
    written at all (its write failed: the entry stayed pending for good)."""
    if len(fields) <= ENTRY_FIELDS:
        return dict(fields)
    items = list(fields.items())
    rest = [x for pair in items[ENTRY_FIELDS:] for x in pair]
    return {**dict(items[:ENTRY_FIELDS]), b"folded": msgpack.packb(rest, use_bin_type=False)}


@attrs.frozen
class Reclaimed:
    msg_id: str
    owner: str
    idle_ms: int
    deliveries: int
    fields: dict[bytes, bytes]
    alone: bool = False
    """A suspect a consumer's start took back (``recover.lua``): to run by itself.
    ``deliveries`` is then its count as it was, not yet counted for this start."""


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
    held: str = ""
    """Why a poison message was left pending this round ('' = none was): Redis refused
    its dead letter (``OOM`` before the call wrote anything, the DLQ key of another kind)."""


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
