"""A type's stream facts, as operators read them: the queue row (``metronome queues``, the
``/metrics`` gauges, the dashboard) built from the replies of ``Streams.queue_infos``,
with numbers that hold even when Redis's own counters are stale."""

from __future__ import annotations

import math
from typing import Any

from actors.store.keys import CONSUMER_GONE_MS, GROUP


def stream_id_ms(entry_id: bytes | str) -> int:
    """When a stream entry was added (the millisecond part of its id)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def stream_id_key(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id as a sortable (ms, seq) pair."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def our_group(groups: Any) -> dict[str, Any] | None:
    """Metronome's consumer group among a stream's ``XINFO GROUPS`` reply (None if the
    stream or the group does not exist yet)."""
    groups = groups if isinstance(groups, list) else []
    return next((g for g in groups if as_text(g["name"]) == GROUP), None)


def as_text(value: Any) -> Any:
    """Redis bytes as text; bytes that are not UTF-8 (another producer's entry, kept as it
    came in a dead-letter queue) are shown with replacement characters, never an error
    that fails the whole listing."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def stored_number(text: str | bytes | None) -> int | None:
    """A stored field's whole number (as text, or as Redis's bytes), or None for one that
    is not one Metronome writes: ASCII digits only (``"²".isdigit()`` is true, and ``int``
    refuses it), at most 15 of them (within MessagePack's and Lua's exact integers).
    Another producer's field, or a hand edit, reads as absent rather than failing its
    reader."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if text is None or not (text.isascii() and text.isdigit() and len(text) <= 15):
        return None
    return int(text)


def error_line(error: str | None) -> str | None:
    """The line of an error that says what happened: in a traceback, the exception's line
    after its last frame (``RuntimeError: boom on attempt 2``), not the traceback's last
    line, which a message of several lines or a note (``add_note``) makes another, with
    the message's first line when it starts on the next; in other text (a timeout's), its
    last non-empty line; else the error itself. Lines end at newlines only, as the
    dashboard's ``errorLine`` splits them."""
    if not error:
        return error
    lines = [line for line in error.split("\n") if line.strip()]
    frames = [at for at, line in enumerate(lines) if line.startswith("  File ")]
    if not frames:
        return lines[-1].strip() if lines else ""
    # after a frame come its source and caret lines, indented, then the exception's line
    after = range(frames[-1] + 1, len(lines))
    at = next((k for k in after if not lines[k].startswith(" ")), len(lines) - 1)
    line = lines[at].strip()
    if line.endswith(":") and at + 1 < len(lines):  # a message that starts on a new line
        return f"{line} {lines[at + 1].strip()}"
    return line


def short_error_line(error: str | None) -> str:
    """``error_line``, at most ``ERROR_LINE_CHARS`` long ('' for none): the line a log
    line, a history entry or the attention list keeps."""
    return (error_line(error) or "")[:ERROR_LINE_CHARS]


#: The longest error line kept (``short_error_line``).
ERROR_LINE_CHARS = 300


def queue_row(
    task_type: str, row: list[Any], now_ms: int, retrying: dict[str, int] | None
) -> dict[str, Any]:
    """One type's backlog from its pipelined replies (a missing stream reads as empty)."""
    entries, dlq, groups, consumers, pending = row
    entries = entries if isinstance(entries, int) else 0
    group = our_group(groups)
    summary: dict[str, Any] = pending if isinstance(pending, dict) else {"pending": 0}
    oldest: bytes | None = summary.get("min")
    in_flight = int(summary["pending"])
    undelivered = _undelivered(group, entries, in_flight)
    return {
        "type": task_type,
        "length": undelivered + in_flight,
        "undelivered": undelivered,
        "pending": in_flight,
        # Clamped: an entry added after ``now_ms`` was read is not "-0.0 s" old.
        "oldest_pending_age_ms": max(0, now_ms - stream_id_ms(oldest)) if oldest else None,
        "consumers": live_consumers(consumers if isinstance(consumers, list) else []),
        "retrying": retrying.get(task_type, 0) if retrying is not None else None,
        "dead_letters": dlq if isinstance(dlq, int) else 0,
    }


def _undelivered(group: dict[str, Any] | None, entries: int, pending: int) -> int:
    """Entries no consumer has read yet: the group's ``lag`` (entries added but not read).
    It stays exact as acknowledged entries are trimmed from the stream's head
    (``trim_acked.lua``); Redis reports none after entries not yet read were deleted (a
    queue purge), and then the stream's entries that are not pending are the bound (an
    over-count by the acknowledged entries not trimmed yet, until consumers catch up)."""
    if group is None:
        return entries
    lag = group.get("lag")
    return min(int(lag), entries) if lag is not None else max(0, entries - pending)


def live_consumers(consumers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's consumers worth showing: the live ones (a live consumer reads at least
    every few seconds) and any holding messages (a dead one's wait for a claimer); a
    consumer gone quiet with nothing pending is left out, and its group entry is removed
    by the claimers within ``CONSUMER_GONE_MS`` plus a pruning round."""
    out = []
    for c in consumers:
        pending, idle = int(c["pending"]), int(c["idle"])
        if pending or idle < CONSUMER_GONE_MS:
            out.append({"name": as_text(c["name"]), "pending": pending, "idle_ms": idle})
    return out


def score_ms(score: bytes | str | float) -> int | float:
    """A sorted set's score as ms: a whole number, or, a score no script writes (``ZADD``
    takes ``inf``), as it is (an answer shows it by name)."""
    value = float(score)
    return int(value) if math.isfinite(value) else value
