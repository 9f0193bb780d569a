"""The Lua <-> Python contract's constants, defined once, and the typed errors codes become.

Every Lua script in ``lua/`` answers with these codes where it answers with a code at all,
and with ``NONE`` (-1) where a time or score may be absent (``claim_due``'s earliest due
time, ``commit_fires``'s next score, ...). ``replay_dead`` answers per entry with a new
stream id or one of ``REPLAY_MISSING`` / ``REPLAY_MALFORMED``. A positional flag argument
is ``FLAG_ON`` or ``FLAG_OFF`` (``flag``). A claim's reply starts with a header of a fixed
number of items (``CLAIM_HEADER``, ``RETRY_CLAIM_HEADER``), then a fixed number per task.
A task's records hold their values in the order of ``STATE_FIELDS``, ``RUN_FIELDS`` and
``DEFINITION_FIELDS``, read by name on both sides (``STATE_NEXT_MS``, ``RUN_RETRIES``, ...),
so a layout change is made here.

The scripts see the same values under the names of ``LUA_NAMES``: ``lua/codes.lua``
declares them and is put before every script (``actors.store.lua``). That file is written
from this module (``python -m actors.store.codes > actors/store/lua/codes.lua``), and
``tests/test_lua_contract.py`` fails when the two differ, when a script declares one of
these names itself, or when a reply header marked ``-- NAME items`` in a script does not
have that many items.
"""

from __future__ import annotations

import enum

from actors.domain.errors import InvalidTransition, TaskConflict, TaskNotFound


class Code(enum.IntEnum):
    """A task script's answer for one task."""

    OK = 1
    UNCHANGED = 0
    CONFLICT = -1
    NOT_FOUND = -2
    BAD_TRANSITION = -3


#: A time or score a script could not give (nothing due, nothing left in the zset).
NONE = -1
REPLAY_MISSING = "missing"
REPLAY_MALFORMED = "malformed"
#: A positional flag argument: set, or not.
FLAG_ON = "1"
FLAG_OFF = ""
#: ``commit_fires``'s answer when an enqueue marker it checks is missing: nothing changed.
NOT_ENQUEUED = -2
#: ``claim_due``'s reply: a header (now, earliest, held, prior, owed, writes, states, owed
#: version, owed from), then per task its id, definition and state records; without
#: definitions, id and state (or, with the states left out too, id and score).
CLAIM_HEADER = 9
CLAIM_ITEMS = 3
LEAN_CLAIM_ITEMS = 2
#: ``claim_retries``'s reply: a header (now, earliest, dropped, unreadable), then per retry
#: its schedule id, task id, type, payload, attempt, due time, prior claim and policy code.
RETRY_CLAIM_HEADER = 4
RETRY_CLAIM_ITEMS = 8

#: The values of a task's records, in their stored order (``actors.store.records`` says why
#: a task is stored so). Python and the scripts read a record's values by the positions
#: below, never by number: each side from its own first index (Python's lists count from 0,
#: Lua's tables from 1), so ``values[STATE_NEXT_MS]`` in Python and ``s[STATE_NEXT_MS]`` in
#: a script read the same value. ``claim_due.lua`` and ``records.status_index`` read the
#: status and whether there is a next time from a state record's first two bytes, so those
#: two stay first (``tests/test_lua_contract.py``).
DEFINITION_FIELDS = ("type", "payload", "schedule", "created_ms")
STATE_FIELDS = (
    "status", "next_ms", "fires", "updated_ms", "runs", "retries", "last_run_ms",
    "last_status", "claim",
)  # fmt: skip
RUN_FIELDS = ("runs", "retries", "last_run_ms", "last_status")
#: How many values each record holds.
DEFINITION_VALUES, STATE_VALUES, RUN_VALUES = map(
    len, (DEFINITION_FIELDS, STATE_FIELDS, RUN_FIELDS)
)
#: Positions of a state record's values (``updated_ms`` is also the task's version).
STATE_STATUS = STATE_FIELDS.index("status")
STATE_NEXT_MS = STATE_FIELDS.index("next_ms")
STATE_FIRES = STATE_FIELDS.index("fires")
STATE_UPDATED_MS = STATE_FIELDS.index("updated_ms")
STATE_RUNS = STATE_FIELDS.index("runs")
STATE_RETRIES = STATE_FIELDS.index("retries")
STATE_LAST_RUN_MS = STATE_FIELDS.index("last_run_ms")
STATE_LAST_STATUS = STATE_FIELDS.index("last_status")
STATE_CLAIM = STATE_FIELDS.index("claim")
#: Positions of a run record's values.
RUN_RUNS = RUN_FIELDS.index("runs")
RUN_RETRIES = RUN_FIELDS.index("retries")
RUN_LAST_RUN_MS = RUN_FIELDS.index("last_run_ms")
RUN_LAST_STATUS = RUN_FIELDS.index("last_status")
#: The positions the scripts read (a definition is read whole: ``local typ, ... = unpack``).
_LUA_POSITIONS = {
    **{f"STATE_{name.upper()}": i for i, name in enumerate(STATE_FIELDS)},
    **{f"RUN_{name.upper()}": i for i, name in enumerate(RUN_FIELDS)},
}

#: The Lua name of each constant the scripts share (``lua/codes.lua``).
#: History fate codes, in the order of ``actors.store.history.FATES``.
FATE_CODES = {
    "FATE_OK": 0, "FATE_FAILED": 1, "FATE_DEAD": 2, "FATE_CANCELLED": 3, "FATE_SKIPPED": 4,
    "FATE_MISFIRED": 5, "FATE_EXPIRED": 6, "FATE_COALESCED": 7,
}  # fmt: skip
#: Most claims of one retry a claim names as prior (``claim_retries.lua``: each earlier
#: claim not known committed, newest first).
RETRY_PRIORS = 8
#: A history entry's bytes, the failed entries' error lines kept, and the time code of
#: "no time" (``lua/history.lua``, ``actors.store.history``).
HISTORY_ENTRY = 12
HISTORY_ERRORS = 5
NO_TIME = 65535
#: Most fields of a stream entry a dead letter carries as they are (``dead_letter.lua``
#: and ``reclaim.lua`` pass them to one XADD: Lua 5.1 passes at most ~8,000 values to a
#: call); past them, the rest go in one field, ``folded``.
ENTRY_FIELDS = 3000
#: The first letters of the policy codes of tracked fires (an overlap policy's, every
#: one but ``allow_all``'s ``A``: ``actors.store.flights.LETTERS``), which a
#: ``cancel_other`` fire may replace: their cancel requests go with them.
TRACKED_POLICIES = "1BCS"

LUA_NAMES: dict[str, int | str] = {
    **{f"CODE_{code.name}": int(code) for code in Code},
    "NONE": NONE,
    "REPLAY_MISSING": REPLAY_MISSING,
    "REPLAY_MALFORMED": REPLAY_MALFORMED,
    "FLAG_ON": FLAG_ON,
    "FLAG_OFF": FLAG_OFF,
    "NOT_ENQUEUED": NOT_ENQUEUED,
    "CLAIM_HEADER": CLAIM_HEADER,
    "CLAIM_ITEMS": CLAIM_ITEMS,
    "LEAN_CLAIM_ITEMS": LEAN_CLAIM_ITEMS,
    "RETRY_CLAIM_HEADER": RETRY_CLAIM_HEADER,
    "RETRY_CLAIM_ITEMS": RETRY_CLAIM_ITEMS,
    "RETRY_PRIORS": RETRY_PRIORS,
    **FATE_CODES,
    "HISTORY_ENTRY": HISTORY_ENTRY,
    "HISTORY_ERRORS": HISTORY_ERRORS,
    "ENTRY_FIELDS": ENTRY_FIELDS,
    "TRACKED_POLICIES": TRACKED_POLICIES,
    "NO_TIME": NO_TIME,
    "STATE_VALUES": STATE_VALUES,
    "RUN_VALUES": RUN_VALUES,
    **{name: i + 1 for name, i in _LUA_POSITIONS.items()},  # Lua counts from 1
}


def flag(on: bool) -> str:
    """A positional flag argument of a script."""
    return FLAG_ON if on else FLAG_OFF


def lua_literal(value: int | str) -> str:
    """``value`` as Lua source (the names' values are small ints and plain strings)."""
    return str(value) if isinstance(value, int) else "'" + value + "'"


def lua_source() -> str:
    """``lua/codes.lua`` as this module defines it."""
    lines = [
        "-- codes.lua: the constants the scripts share with Python, put before every script.",
        "-- Written from actors/store/codes.py (python -m actors.store.codes > this file);",
        "-- tests/test_lua_contract.py fails when the two differ. Edit codes.py, not this.",
    ]
    lines += [f"local {name} = {lua_literal(value)}" for name, value in LUA_NAMES.items()]
    return "\n".join(lines) + "\n"


def optional_ms(raw: object) -> int | None:
    """A script's time reply (an integer, or a score as bytes) with ``NONE`` as None."""
    value = int(float(raw))  # type: ignore[arg-type]
    return None if value < 0 else value


def raise_for_code(code: int, task_id: str, detail: str = "") -> None:
    """Turn a task script's code into its typed error, or return for success codes."""
    if code in (Code.OK, Code.UNCHANGED):
        return
    if code == Code.NOT_FOUND:
        raise TaskNotFound(task_id)
    if code == Code.CONFLICT:
        raise TaskConflict(f"task {task_id!r} exists with a different type, payload or schedule")
    if code == Code.BAD_TRANSITION:
        raise InvalidTransition(f"task {task_id!r}: {detail}")
    raise RuntimeError(f"unexpected script code {code} for task {task_id!r}")


if __name__ == "__main__":
    print(lua_source(), end="")
