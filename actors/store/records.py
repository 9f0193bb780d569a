"""How a task is stored: compact records in bucket hashes (layout version 3).

A task is not a Redis key of its own. Its **definition** (type, payload, schedule, created),
its **state** (status, next grid time, fires, version) and, once it has run, its **run
record** (runs, consecutive failures, last run and its outcome) are values, each a field
named by the task id in a bucket hash of its partition (``actors.store.keys``). A hash of
at most 128 fields with values under 64 bytes is kept by Redis as one flat listpack, so a
task costs its id and its values, not a key, a hash table and field names: about 100
bytes instead of 266 (docs/PERFORMANCE.md). Splitting them keeps each short, and gives
each record one writer on the fire path: the claim only reads the definition and state;
the commit writes the state, built by the poller from the claimed one
(``advanced_values``), without reading it again while no API write touched the partition
(``commit_fires.lua``); the consumers' outcomes write the run record alone. A payload too
long for a listpack value turns its bucket into an ordinary hash table: it costs memory,
never correctness.

Records are concatenated MessagePack values, written by the Lua scripts with
``cmsgpack.pack`` (and the poller with ``pack_values``) and read with ``cmsgpack.unpack``
there and ``unpack`` here:

- definition: type, payload (JSON text), schedule (``encode_schedule``), created_ms
- state: status code, next_ms or nil, fires, updated_ms or nil (also the task's version:
  every API write gives a later one than its partition gave before, ``new_version`` in
  ``records.lua``; a commit is refused if it moved since the claim, and pollers keep
  definitions by it),
  runs, retries or nil, last_run_ms or nil, last status code or nil (these four as of
  layout 2: a task that has not run since keeps its counts here), claim token or nil
  (written by versions before partition ownership; cleared by the next commit)
- run: runs, retries or nil, last_run_ms, last status code

The order of each record's values is defined once, in ``actors.store.codes``
(``DEFINITION_FIELDS``, ``STATE_FIELDS``, ``RUN_FIELDS``), and read by name on both sides:
here and in the poller's claim as ``values[STATE_NEXT_MS]``, in the scripts as
``s[STATE_NEXT_MS]`` (``lua/codes.lua``), so a layout change is made there.

The last error lives in the partition's ``errors`` hash (only failing tasks have one), so an
error message cannot push a record past the listpack limit. Codes are small integers; their
names are below and in ``actors/store/lua/records.lua``.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import msgpack

from actors.domain.labels import decode_labels
from actors.domain.model import STATUSES, Task, converter
from actors.domain.schedules import Misfire, Overlap, Schedule
from actors.store.codes import (
    DEFINITION_VALUES,
    RUN_VALUES,
    STATE_CLAIM,
    STATE_FIRES,
    STATE_NEXT_MS,
    STATE_STATUS,
    STATE_VALUES,
)

#: Status codes as stored: a status is stored as its index in ``model.STATUSES``.
STATUS_NAMES = STATUSES
#: Last-outcome codes as stored; index = code.
OUTCOME_NAMES: tuple[str, ...] = ("ok", "retry", "dead")

#: Schedule fields in the order of their stored codes (a stored schedule is a map of code to
#: value, only the fields that differ from their defaults, as ``Schedule.to_dict`` gives).
#: Append only: a stored code never changes meaning.
_SCHEDULE_FIELDS: tuple[str, ...] = (
    "kind", "every_s", "cron", "tz", "at_ms", "start_ms", "end_ms", "max_runs", "jitter_s",
    "misfire", "misfire_cap", "overlap", "catchup_window_s", "spread_s", "pause_after_failures",
)  # fmt: skip
_FIELD_CODE = {name: code for code, name in enumerate(_SCHEDULE_FIELDS)}
#: Enumerated string values stored as codes.
_VALUE_CODES: dict[str, tuple[str, ...]] = {
    "kind": ("interval", "cron", "once"),
    "misfire": typing.get_args(Misfire),
    "overlap": typing.get_args(Overlap),
}


#: MessagePack array headers of 0..15 values: a record behind one reads as an array.
ARRAY_HEADERS = [bytes((0x90 + n,)) for n in range(16)]


class RecordError(ValueError):
    """Stored bytes that are not a record this version wrote."""


def encode_schedule(schedule: Schedule) -> bytes:
    """A schedule in a few bytes (an interval of 60 s: 5), deterministic for equal
    schedules: create compares stored and given bytes to detect a changed definition."""
    out: dict[int, Any] = {}
    for name, value in schedule.to_dict().items():
        if name in _VALUE_CODES:
            value = _VALUE_CODES[name].index(value)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)  # 60 packs in one byte, 60.0 in nine
        out[_FIELD_CODE[name]] = value
    return bytes(msgpack.packb(out))


def decode_schedule(raw: bytes) -> Schedule:
    try:
        stored = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        data: dict[str, Any] = {}
        for code, value in stored.items():
            name = _SCHEDULE_FIELDS[code]
            data[name] = _VALUE_CODES[name][value] if name in _VALUE_CODES else value
        return converter.structure(data, Schedule)
    except Exception as exc:
        raise RecordError(f"stored schedule {raw!r} is not one Metronome wrote: {exc!r}") from exc


def encode_definition(task_type: str, payload_json: str, schedule: bytes, created_ms: int) -> bytes:
    """The definition as ``create_tasks.lua`` writes it (used by the layout migrations)."""
    return pack_values([task_type, payload_json, schedule, created_ms])


def needs_rewrite(definition: bytes) -> bool:
    """Whether a definition holds a MessagePack ``bin`` value, which the scripts' cmsgpack
    cannot read ("Bad data format"): the 1 -> 2 migration of earlier versions stored
    schedules so (``metronome migrate`` from layout 2 rewrites them)."""
    try:
        values = msgpack.unpackb(
            ARRAY_HEADERS[DEFINITION_VALUES] + definition,
            raw=False,
            unicode_errors="surrogateescape",
        )
    except Exception:
        return False  # not one this version reads either way: left for its readers to name
    return any(isinstance(v, bytes) for v in values)


def rewritten_definition(definition: bytes) -> bytes:
    """A definition as the scripts write it (every string a MessagePack ``str``)."""
    task_type, payload, sched, created = unpack(definition, DEFINITION_VALUES)
    return pack_values([task_type, payload, sched, created])


def encode_state(
    status: str,
    next_ms: int | None,
    fires: int,
    updated_ms: int | None,
    runs: int,
    retries: int,
    last_run_ms: int | None,
    last_status: str | None,
    claim: str | None = None,
) -> bytes:
    """The state as the scripts write it (used by the layout migration)."""
    values = (
        STATUS_NAMES.index(status), next_ms, fires, updated_ms, runs, retries or None,
        last_run_ms, None if last_status is None else OUTCOME_NAMES.index(last_status), claim,
    )  # fmt: skip
    return pack_values(list(values))


def unpack(raw: bytes, count: int) -> list[Any]:
    """The ``count`` values of a record; strings come back as bytes. Raises RecordError.

    A record is ``count`` MessagePack values one after another: behind an array header of
    ``count`` it is one array, which ``msgpack.unpackb`` reads in one C call (~0.7 µs; an
    ``Unpacker`` costs 3.8). Only a record that does not read so takes the slow way, for an
    error that says what is wrong with it."""
    if count < 16:
        try:
            values: list[Any] = msgpack.unpackb(ARRAY_HEADERS[count] + raw, raw=True)
            return values
        except Exception:  # the slow way below names what is wrong
            pass
    unpacker = msgpack.Unpacker(raw=True)
    unpacker.feed(raw)
    try:
        values = list(unpacker)
    except Exception as exc:
        raise RecordError(f"record {raw[:80]!r} is not MessagePack: {exc!r}") from exc
    if len(values) != count:
        raise RecordError(f"record {raw[:80]!r} has {len(values)} values, not {count}")
    return values


#: Strings and bytes both as MessagePack ``str``: Redis's cmsgpack reads no ``bin``.
_PACKER = msgpack.Packer(use_bin_type=False)
#: A state's status code for a task whose schedule has no grid time left.
_FINISHED = STATUS_NAMES.index("finished")


def pack_array(values: list[Any]) -> bytes:
    """Values as one MessagePack array, as a script reads one argument with
    ``cmsgpack.unpack`` (strings and bytes both ``str``: one C call decodes it)."""
    packed: bytes = _PACKER.pack(values)
    return packed


def pack_values(values: list[Any]) -> bytes:
    """Values as one record (``unpack``'s inverse): packed as an array in one C call, its
    header left off."""
    packed: bytes = _PACKER.pack(values)
    return packed[1:] if len(values) < 16 else packed[3:]


def advanced_values(values: list[Any], next_ms: int | None, fired: int) -> list[Any]:
    """A claimed state record's values (its ``STATE_VALUES``) after its fires were
    enqueued: the grid at ``next_ms`` (None: finished), ``fired`` more fires, no claim
    token. The counts of runs it may carry (layout 2) go along unchanged. Built here, on the
    poller, so that a commit costs Redis a plain write of them (``commit_fires.lua``)."""
    new = list(values)
    if next_ms is None:
        new[STATE_STATUS], new[STATE_NEXT_MS] = _FINISHED, None
    else:
        new[STATE_NEXT_MS] = next_ms
    new[STATE_FIRES] = values[STATE_FIRES] + fired
    new[STATE_CLAIM] = None
    return new


def status_index(state: bytes) -> int | None:
    """A state record's status (an index into ``STATUS_NAMES``) from its first byte: the
    status is the record's first value, a MessagePack positive fixint. None for a record
    that does not start so (not one this version wrote)."""
    first = state[0] if state else 0xFF
    return first if first < len(STATUS_NAMES) else None


def claim_of(state: bytes) -> str | None:
    """The token of the poller holding the task's due fire, if any (explain shows it)."""
    claim = unpack(state, STATE_VALUES)[STATE_CLAIM]
    if claim is None:
        return None
    return claim.decode(errors="replace") if isinstance(claim, bytes) else str(claim)


def decode_task(
    task_id: str,
    definition: bytes,
    state: bytes,
    error: bytes | None,
    run: bytes | None = None,
    labels: bytes | None = None,
) -> Task:
    """A task from its records (the run record, last error and labels if it has them).
    Raises RecordError naming the record and what is wrong with it (never quoting it: a
    definition holds the payload, which may be secret, and the error is logged)."""
    where = "definition"
    try:
        task_type, payload, sched, created = _record(definition, DEFINITION_VALUES)
        if not (isinstance(task_type, bytes) and isinstance(payload, bytes)):
            raise ValueError("its type or payload is not text")
        _whole(created, optional=False)
        parsed, schedule = json.loads(payload), decode_schedule(sched)
        where = "state"
        status, next_ms, fires, updated, runs, retries, last_run, last_status, _ = _record(
            state, STATE_VALUES
        )
        if not (_is_int(status) and 0 <= status < len(STATUS_NAMES)):
            raise ValueError(f"status code {status!r} is not one of 0..{len(STATUS_NAMES) - 1}")
        _whole(fires, optional=False)
        _whole(next_ms, updated)
        if run is not None:
            where = "run"
            runs, retries, last_run, last_status = _record(run, RUN_VALUES)
        _whole(runs, retries, last_run)
        if last_status is not None and not (
            _is_int(last_status) and 0 <= last_status < len(OUTCOME_NAMES)
        ):
            raise ValueError(f"last outcome code {last_status!r} is not one of 0..2")
        where = "labels"
        task_labels = decode_labels(labels)
        return Task(
            task_id=task_id,
            type=task_type.decode(),
            payload=parsed,
            schedule=schedule,
            status=STATUS_NAMES[status],
            created_ms=created,
            updated_ms=created if updated is None else updated,
            next_run_ms=next_ms,
            fires=fires,
            runs=runs,
            retries=retries or 0,
            last_run_ms=last_run,
            last_status=None if last_status is None else OUTCOME_NAMES[last_status],
            last_error=None if error is None else error.decode(errors="replace"),
            labels=task_labels,
        )
    except (RecordError, ValueError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        # RecursionError: JSON nested past what the decoder follows (another program's)
        raise RecordError(
            f"task {task_id!r}: its {where} record is not one Metronome wrote: {exc}"
        ) from exc


def _record(raw: bytes, count: int) -> list[Any]:
    """``unpack``, its error saying what is wrong without quoting the record."""
    try:
        return unpack(raw, count)
    except RecordError:
        unpacker = msgpack.Unpacker(raw=True)
        unpacker.feed(raw)
        try:
            found = len(list(unpacker))
        except Exception:
            raise RecordError("it is not MessagePack") from None
        raise RecordError(f"it has {found} values, not {count}") from None


def _is_int(value: Any) -> bool:
    return type(value) is int


def _whole(*values: Any, optional: bool = True) -> None:
    """ValueError unless each value is a whole number (or None, when ``optional``): what
    the scripts write."""
    for value in values:
        if not (_is_int(value) or (optional and value is None)):
            raise ValueError(f"{value!r} is not a whole number")
