"""The Lua scripts and their Python faces share their constants from one definition.

``actors/store/codes.py`` defines the codes, flags and reply layouts both sides use;
``lua/codes.lua``, put before every script, is written from it. These tests fail when the
two drift apart: the file differs from what ``codes.py`` writes, a script declares one of
the shared names itself (shadowing the shared value), a reply header marked
``-- NAME items`` has another number of items than ``NAME``, a script declares a constant
Python does not know, ``records.lua``'s status codes differ from ``records.py``'s, or a
record's value is read by number instead of by its name.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgpack
import pytest

from actors.store import codes, lua
from actors.store.codes import LUA_NAMES, STATE_FIELDS, lua_literal, lua_source
from actors.store.records import STATUS_NAMES
from runtime.redis_io import Script

LUA_DIR = Path(lua.__file__).parent / "lua"
SCRIPTS = {p.name: p.read_text() for p in sorted(LUA_DIR.glob("*.lua"))}
#: ``local A, B = 1, 2`` at the start of a line (a script's top level, or a prelude's).
LOCAL = re.compile(r"^local ([A-Za-z_][\w, ]*?)\s*=\s*(.+?)\s*(?:--.*)?$", re.MULTILINE)
UPPER = re.compile(r"[A-Z][A-Z0-9_]*")
#: The constants ``records.lua`` declares, as ``records.py`` has them.
RECORDS = {
    **{name.upper(): lua_literal(i) for i, name in enumerate(STATUS_NAMES)},
    "STATUS_NAMES": "{[0] = " + ", ".join(f"'{name}'" for name in STATUS_NAMES) + "}",
    "MP_NIL": f"0x{msgpack.packb(None)[0]:x}",
}


def _constants() -> dict[tuple[str, str], str]:
    """(file, NAME) -> the Lua source of its value, for every upper-case name a script
    declares with ``local`` (one by one where several are declared at once)."""
    found: dict[tuple[str, str], str] = {}
    for file, source in SCRIPTS.items():
        for names, values in LOCAL.findall(source):
            declared = [n.strip() for n in names.split(",")]
            if not all(UPPER.fullmatch(n) for n in declared):
                continue
            parts = [values] if len(declared) == 1 else [v.strip() for v in values.split(",")]
            found |= {(file, n): v for n, v in zip(declared, parts, strict=True)}
    return found


def _top_level_items(literal: str) -> int:
    """How many items a Lua table constructor ``{...}`` holds at its top level."""
    depth, items, empty = 0, 1, True
    quote = None
    for char in literal:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
            if depth == 0:
                break
        elif char == "," and depth == 1:
            items += 1
        if depth >= 1 and char not in " {":
            empty = False
    return 0 if empty else items


def test_codes_lua_is_what_codes_py_writes() -> None:
    assert SCRIPTS["codes.lua"] == lua_source(), (
        "regenerate it: python -m actors.store.codes > actors/store/lua/codes.lua"
    )


def test_every_script_is_loaded_after_the_shared_constants() -> None:
    scripts = [s for s in vars(lua).values() if isinstance(s, Script)]
    assert len(scripts) >= 30
    assert [s.name for s in scripts if not s.source.startswith(lua_source())] == []


def test_no_script_declares_a_shared_name_itself() -> None:
    shadowed = sorted(f"{f}: {n}" for f, n in _constants() if f != "codes.lua" and n in LUA_NAMES)
    assert shadowed == []


def test_every_constant_a_script_declares_is_defined_on_the_python_side() -> None:
    declared = _constants()
    assert {n: v for (f, n), v in declared.items() if f == "codes.lua"} == {
        n: lua_literal(v) for n, v in LUA_NAMES.items()
    }
    records = {n: v for (f, n), v in declared.items() if f == "records.lua"}
    assert records == RECORDS
    unknown = sorted(f"{f}: {n}" for f, n in declared if f not in ("codes.lua", "records.lua"))
    assert unknown == [], "define it in actors/store/codes.py (LUA_NAMES) instead"


def test_marked_reply_headers_have_as_many_items_as_python_reads() -> None:
    marked = []
    for file, source in SCRIPTS.items():
        lines = source.splitlines()
        for i, line in enumerate(lines):
            mark = re.fullmatch(r"\s*-- ([A-Z_]+) items", line)
            if mark:
                name = mark.group(1)
                rest = "\n".join(lines[i + 1 :])  # the constructor may go on over lines
                literal = rest[rest.index("{") :]
                marked.append((file, name, _top_level_items(literal), LUA_NAMES[name]))
    assert {(f, n) for f, n, _, _ in marked} >= {
        ("claim_due.lua", "CLAIM_HEADER"), ("claim_retries.lua", "RETRY_CLAIM_HEADER"),
    }  # fmt: skip
    assert [m for m in marked if m[2] != m[3]] == []


@pytest.mark.parametrize(
    ("literal", "items"),
    [("{}", 0), ("{now, NONE}", 2), ("{a, f(b, c), {d, e}, 'x,y'}", 4), ("{now, NONE} -- x", 2)],
)
def test_items_of_a_table_constructor_are_counted_at_its_top_level(
    literal: str, items: int
) -> None:
    assert _top_level_items(literal) == items


def test_record_positions_are_named_alike_on_both_sides() -> None:
    """``STATE_NEXT_MS`` in Python and in a script name the same value, each side counting
    from its own first index."""
    positions = {n: v for n, v in LUA_NAMES.items() if n.startswith(("STATE_", "RUN_"))}
    positions = {n: v for n, v in positions.items() if not n.endswith("_VALUES")}
    assert len(positions) == len(STATE_FIELDS) + len(codes.RUN_FIELDS)
    assert {n: getattr(codes, n) + 1 for n in positions} == positions
    # claim_due.lua and records.status_index read these two from a state's first bytes
    assert STATE_FIELDS[:2] == ("status", "next_ms")


#: ``s[2]``, ``r[4]``, ``state[1]``: a record's value read by number.
BY_NUMBER = re.compile(r"\b(?:s|st|state|r|run|s0|values)\[[0-9]+\]")


def test_no_script_reads_a_record_by_number() -> None:
    found = [f"{f}: {m}" for f, source in SCRIPTS.items() for m in BY_NUMBER.findall(source)]
    assert found == [], "read it by name (STATE_*, RUN_* in actors/store/codes.py)"


def test_the_tracked_policies_are_every_overlap_letter_but_allow_alls() -> None:
    """``TRACKED_POLICIES`` (the scripts' copy) names the letters of ``flights.LETTERS``
    whose fires are tracked: all but ``allow_all``'s."""
    from actors.store.flights import LETTERS, TRACKED_LETTERS

    assert frozenset(LETTERS.values()) - {LETTERS["allow_all"]} == TRACKED_LETTERS
    assert set(codes.TRACKED_POLICIES) == TRACKED_LETTERS
