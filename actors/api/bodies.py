"""Request bodies and parameters: parsed and checked before anything is read or written.

Bodies are JSON objects structured with the project's one strict cattrs converter (unknown
keys and wrong types are errors naming the field); path and query parameters that end up
in keys are checked against the same name pattern as everything else.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any, TypeVar

import attrs
import cattrs

from actors.api.problems import Problem, invalid
from actors.domain.model import MAX_TASK_ID, RepeatedKey, converter, decode_json
from actors.domain.schedules import Overlap
from runtime.config import check_name, describe

T = TypeVar("T")

ENTRY_ID_PATTERN = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_U64 = 2**64
MAX_PAGE = 1000


def entry_id(text: str) -> str | None:
    """A stream entry id Redis accepts (``ms-seq``, both unsigned 64-bit) in canonical form
    (``007-0`` -> ``7-0``), or None."""
    if not ENTRY_ID_PATTERN.fullmatch(text):
        return None
    ms, seq = (int(part) for part in text.split("-"))
    return f"{ms}-{seq}" if ms < _U64 and seq < _U64 else None


@attrs.frozen
class ClearBody:
    confirm: str
    """Must repeat the type's name: clearing is not undoable."""


@attrs.frozen
class EntriesBody:
    """Dead letters to replay or purge: some ids (kept in canonical form), or ``all``."""

    entry_ids: list[str] | None = None
    all: bool = False
    confirm: str | None = None
    """Purging all: must repeat the type's name."""

    def __attrs_post_init__(self) -> None:
        if (self.entry_ids is None) == (not self.all):
            raise ValueError("entry_ids: give either entry_ids or all = true")
        if self.entry_ids is None:
            return
        if not 1 <= len(self.entry_ids) <= MAX_PAGE:
            raise ValueError(f"entry_ids: give 1-{MAX_PAGE} ids per request")
        canonical = []
        for i, given in enumerate(self.entry_ids):
            checked = entry_id(given)
            if checked is None:
                raise ValueError(f"entry_ids[{i}]: {given!r} is not a stream entry id")
            canonical.append(checked)
        # one entry named twice (7-0 and 007-0 too) is one: its second outcome would say
        # "missing" of an entry the first one replayed
        object.__setattr__(self, "entry_ids", list(dict.fromkeys(canonical)))


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_body(body: bytes, *, required: bool = True) -> Any:
    if not body:
        if required:
            raise Problem(400, "bad_json", "the request needs a JSON body")
        return None
    try:
        data = decode_json(body, parse_constant=_not_json)
        # A \ud800 escape decodes to a lone surrogate, text UTF-8 cannot carry: refused
        # here, before anything is written (it would fail the write, or every reader).
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        raise Problem(
            400, "bad_json", "the body holds a lone surrogate escape (\\ud800-\\udfff alone)"
        ) from None
    except RepeatedKey as exc:  # JSON parsers keep the last: which was meant is not known
        raise Problem(400, "bad_json", f"the body is ambiguous: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise Problem(400, "bad_json", "the body is nested too deeply") from None
    return data


def json_object(body: bytes) -> dict[str, Any]:
    data = json_body(body)
    if not isinstance(data, dict):
        raise invalid(f"body: must be a JSON object, got {type(data).__name__}")
    return data


def overlap_param(body: bytes) -> Overlap:
    """The overlap policy a trigger asks for (an optional body ``{"overlap": ...}``;
    default ``allow_all``), or 422 naming the problem."""
    if not body.strip():
        return "allow_all"
    data = json_object(body)
    unknown = sorted(set(data) - {"overlap"})
    if unknown:
        raise invalid("; ".join(f"{k}: unknown key (known keys: overlap)" for k in unknown))
    overlap = data.get("overlap", "allow_all")
    if overlap not in typing.get_args(Overlap):
        raise invalid(f"overlap: must be one of {', '.join(typing.get_args(Overlap))}")
    return typing.cast(Overlap, overlap)


def structure(body: bytes, cls: type[T]) -> T:
    data = json_object(body)
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise invalid(describe(exc)) from None


def name_param(kind: str, value: str, max_len: int = 64) -> str:
    try:
        return check_name(kind, value, max_len)
    except ValueError as exc:
        raise invalid(f"{kind}: {exc}") from None


def task_id_param(value: str) -> str:
    return name_param("task_id", value, MAX_TASK_ID)


def entry_id_param(value: str, name: str = "entry_id") -> str:
    canonical = entry_id(value)
    if canonical is None:
        raise invalid(f"{name}: {value!r} is not a stream entry id (like 1700000000000-0)")
    return canonical


def limit_param(query: Any, default: int) -> int:
    raw = query.get("limit")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 9) or not 1 <= int(raw) <= MAX_PAGE:
        raise invalid(f"limit: must be an integer within 1..{MAX_PAGE}, got {raw!r}")
    return int(raw)


#: Query parameters that may be given more than once (each ``label`` filter is one more).
REPEATABLE = frozenset({"label"})


def only_keys(query: Any, allowed: set[str]) -> None:
    """Refuse a query parameter the endpoint does not take, and one given twice that is
    not ``REPEATABLE``: read with the last value, ``status=active&status=paused`` would
    list the paused tasks alone (bodies refuse a key given twice for the same reason)."""
    unknown = sorted(set(query.keys()) - allowed)
    if unknown:
        raise invalid("; ".join(f"{k}: unknown query parameter" for k in unknown))
    names = [name for name, _ in query.multi_items()]
    twice = sorted({n for n in names if names.count(n) > 1} - REPEATABLE)
    if twice:
        raise invalid("; ".join(f"{k}: given more than once" for k in twice))
