"""A task's occurrence history: the fate of each of its last grid times and manual fires.

Every script that decides a fire's fate writes it into the task's ring in the same call
(``lua/history.lua``), so keeping history costs no round trip: the consumer's outcome
script (``ok``, ``failed`` and retried, ``dead``, ``cancelled``, ``expired`` at the
start), the poller's overlap decision (``skipped``: overlap, ``expired`` past the catch-up
window) and its commit (the misfire policy's ``coalesced`` and ``skipped``: misfire).

**The ring** (``Keys.history``: task id -> bytes) is one value in the partition's slot,
newest first, at most ``[scheduler] history`` entries (default 20): a 6-byte base time,
then 12 bytes an entry — the fate, origin and attempt in one byte, the due time as a
signed 5-byte offset from the base (ms), the start's lateness and the run time as 2-byte
time codes (ms below 32,768, then whole seconds up to ~9 hours), and the node's number
(``node_number.lua``: 2 bytes instead of its name; ``Keys.node_numbers`` maps them
back). Fixed-width entries make a write one read, a concatenation and a cut — no
decoding — and a full ring of 20 is 246 bytes. A failed entry's error line lives beside
it (``Keys.history_errors``: the last five, ``due attempt text`` a line), so a ring stays
small for the tasks that never fail.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import attrs

from actors.store.codes import FATE_CODES, HISTORY_ENTRY, NO_TIME
from actors.store.queue_rows import stored_number

#: Fates in the order of their codes (``history.lua``). ``skipped`` carries its reason.
FATES: tuple[tuple[str, str | None], ...] = (
    ("ok", None),
    ("failed", None),
    ("dead", None),
    ("cancelled", None),
    ("skipped", "overlap"),
    ("skipped", "misfire"),
    ("skipped", "expired"),
    ("coalesced", None),
)
#: Fate names, each once (what ``last_fate`` may be).
FATE_NAMES = ("ok", "failed", "dead", "cancelled", "skipped", "coalesced")
#: The misfire policy's fates (``commit_fires.lua`` records them).
MISFIRE_SKIPPED, COALESCED = FATE_CODES["FATE_MISFIRED"], FATE_CODES["FATE_COALESCED"]
#: Where a fire came from, by code: its task's schedule, an operator's trigger or
#: backfill, or a replayed dead letter.
ORIGINS = ("schedule", "trigger", "backfill", "replay")
ORIGIN_CODES = {name: code for code, name in enumerate(ORIGINS)}
#: The default ring length (``[scheduler] history``).
DEFAULT_HISTORY = 20
#: The most entries a ring may keep (the config's bound).
MAX_HISTORY = 200
_HEADER = 6
_ENTRY = HISTORY_ENTRY
_NO_TIME = NO_TIME


@attrs.frozen
class Ledger:
    """What a consumer's outcome script needs besides the outcomes: the ring's length,
    this node's number and its type's lateness bound (0 = none)."""

    keep: int = DEFAULT_HISTORY
    node: int = 0
    late_ms: int = 0


@attrs.frozen
class Occurrence:
    """One entry of a task's history."""

    fate: str
    reason: str | None
    origin: str
    attempt: int
    due_ms: int
    started_ms: int | None
    finished_ms: int | None
    node: str | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _time(code: int) -> int | None:
    if code == _NO_TIME:
        return None
    return code if code < 32768 else (code - 32768) * 1000


def decode_ring(
    raw: bytes, nodes: Mapping[int, str] | None = None, errors: bytes | None = None
) -> list[Occurrence]:
    """A stored ring as occurrences, newest first; ``nodes`` names node numbers, ``errors``
    (the task's error lines) gives failed entries their error. Bytes that do not make a
    whole entry are ignored (a ring is only ever written whole)."""
    if len(raw) < _HEADER:
        return []
    base = int.from_bytes(raw[:_HEADER], "big")
    lines = _error_lines(errors)
    out = []
    for at in range(_HEADER, len(raw) - _ENTRY + 1, _ENTRY):
        head = raw[at]
        offset = int.from_bytes(raw[at + 1 : at + 6], "big", signed=True)
        lag, run, node = struct.unpack_from(">HHH", raw, at + 6)
        fate, reason = FATES[head % 8]
        due = base + offset
        attempt = head >> 5
        started = None if _time(lag) is None else due + (_time(lag) or 0)
        finished = None if started is None or _time(run) is None else started + (_time(run) or 0)
        out.append(
            Occurrence(
                fate=fate,
                reason=reason,
                origin=ORIGINS[(head >> 3) % 4],
                attempt=attempt,
                due_ms=due,
                started_ms=started,
                finished_ms=finished,
                node=(nodes or {}).get(node, f"#{node}") if node else None,
                error=lines.get((due, attempt)) if fate in ("failed", "dead") else None,
            )
        )
    return out


def _error_lines(raw: bytes | None) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for line in (raw or b"").decode(errors="replace").split("\n"):  # as error_line splits
        due, _, rest = line.partition(" ")
        attempt, _, text = rest.partition(" ")
        due_ms, tries = stored_number(due), stored_number(attempt)
        if due_ms is not None and tries is not None:
            out.setdefault((due_ms, min(tries, 7)), text)
    return out


def node_names(raw: Mapping[bytes, bytes]) -> dict[int, str]:
    """The node-number hash (``node_number.lua``) as number -> name."""
    out = {}
    for field, value in raw.items():
        name = field.decode(errors="replace")
        if name.startswith("number:") and name[7:].isdecimal():
            out[int(name[7:])] = value.decode(errors="replace")
    return out


def latest_fate(raw: bytes | None) -> str | None:
    """The fate of a ring's newest entry (``skipped`` with no reason), or None."""
    if raw is None or len(raw) < _HEADER + _ENTRY:
        return None
    return FATES[raw[_HEADER] % 8][0]
