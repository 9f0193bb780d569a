"""The one table of script return codes, and the typed errors they become.

Every Lua script in ``lua/`` answers with these codes where it answers with a code at all,
and with ``NONE`` (-1) where a time or score may be absent (``claim_due``'s earliest due
time, ``commit_fires``'s next score, ...). ``replay_dead`` answers per entry with a new
stream id or one of ``REPLAY_MISSING`` / ``REPLAY_MALFORMED``.
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
