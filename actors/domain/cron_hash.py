"""Hashed cron fields (``H``, as in Jenkins): a minute or hour chosen from the task id.

Thousands of tasks written ``0 9 * * *`` all fire in the same second; written
``H 9 * * *`` each fires at its own minute of nine o'clock, the same one on every node and
every day. Forms, in the minute and hour fields only (alone or as items of a list):

- ``H``: one value of the field's range (minute 0-59, hour 0-23);
- ``H(a-b)``: one value within ``a-b``;
- ``H/n``: every ``n``, starting at a value below ``n`` (``H/15`` → e.g. ``7-59/15``);
- ``H(a-b)/n``: every ``n`` within ``a-b``, starting at a value of its first step.

The expression is resolved once, when a task is created or its schedule replaced
(``Schedule.for_task``): the stored cron is concrete, so every reader (poller, explain,
previews) evaluates a plain five-field expression, and a bulk of tasks may share the one
schedule object they were sent with until each is given its own.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable

#: The fields that may be hashed: position in the expression → (name, lowest, highest).
_HASHABLE = {0: ("minute", 0, 59), 1: ("hour", 0, 23)}
_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FORM = re.compile(r"H(?:\((\d+)-(\d+)\))?(?:/(\d+))?")


def is_hashed(cron: str) -> bool:
    """Whether any item of the expression is an ``H`` form (which must be resolved)."""
    return any(item.startswith("H") for field in cron.split() for item in field.split(","))


def resolve_hashed(cron: str, task_id: str) -> str:
    """The expression with each ``H`` item replaced by the values ``task_id`` picks:
    deterministic, and independent per field (the minute does not follow the hour).
    ValueError naming the field for an ``H`` the grammar does not allow."""
    return _resolve_picks(cron, lambda position: _hash(task_id, position))


def resolutions(cron: str) -> set[str]:
    """Every expression ``resolve_hashed`` gives ``cron``, whatever the task id: a
    field's pick counts only by its remainder, so the field's width of picks is each."""
    hashed = [p for p, field in enumerate(cron.split()[:2]) if "H" in field]
    widths = [_HASHABLE[p][2] - _HASHABLE[p][1] + 1 for p in hashed]
    return {
        _resolve_picks(cron, dict(zip(hashed, picks, strict=True)).__getitem__)
        for picks in itertools.product(*(range(w) for w in widths))
    }


def _resolve_picks(cron: str, pick_of: Callable[[int], int]) -> str:
    fields = cron.split()
    out = []
    for position, field in enumerate(fields):
        items = field.split(",")
        if not any(item.startswith("H") for item in items):
            out.append(field)
            continue
        if position not in _HASHABLE:
            name = _NAMES[position] if position < len(_NAMES) else f"field {position + 1}"
            raise ValueError(f"H is allowed in the minute and hour fields only, not in {name}")
        name, low, high = _HASHABLE[position]
        pick = pick_of(position)
        out.append(",".join(_resolve(item, name, low, high, pick) for item in items))
    return " ".join(out)


def _resolve(item: str, name: str, low: int, high: int, pick: int) -> str:
    if not item.startswith("H"):
        return item
    form = _FORM.fullmatch(item)
    if form is None:
        raise ValueError(f"{name}: {item!r} is not H, H(a-b), H/n or H(a-b)/n")
    first, last, step = form.groups()
    if first is not None:
        low, high = _range(name, int(first), int(last), low, high)
    span = high - low + 1
    if step is None:
        return str(low + pick % span)
    every = int(step)
    if not 1 <= every <= span:
        raise ValueError(f"{name}: the step of {item!r} must be within 1..{span}")
    return f"{low + pick % every}-{high}/{every}"


def _range(name: str, first: int, last: int, low: int, high: int) -> tuple[int, int]:
    if not low <= first <= last <= high:
        raise ValueError(f"{name}: H({first}-{last}) must be within {low}-{high}, low to high")
    return first, last


def _hash(task_id: str, position: int) -> int:
    """A number from the task id and field: stable across versions, nodes and restarts,
    and a different hash from the spread offset's (``Schedule.offset_ms``)."""
    digest = hashlib.blake2b(
        task_id.encode(), digest_size=8, person=b"metronome-H", salt=bytes([position])
    ).digest()
    return int.from_bytes(digest, "big")
