"""docs/CONFIGURATION.md's table of keys matches the config classes, so it cannot drift.

Every field of every section (walked from ``actors.config.Config``, which holds the
runtime's ``[node]``, ``[log]`` and ``[redis]`` sections too) has a row with its default,
and every row names a real field. A default is written as a TOML value in backticks
(``60.0``, ``"json"``, ``[]``), or as ``none`` (not set), ``required`` (no default) or
``host name``; a row naming several keys gives one default for all or one per key.
"""

from __future__ import annotations

import re
import socket
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from actors.config import Config

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"
HEADER = "| key | default | meaning |"
REQUIRED = object()
WORDS: dict[str, Any] = {"none": None, "required": REQUIRED, "host name": socket.gethostname()}


def _unwrap_optional(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def _label(path: str, array: bool) -> str:
    return f"[[{path}]]" if array else f"[{path}]" if path else ""


def code_fields(cls: type, path: str = "", array: bool = False) -> Iterator[tuple[str, Any]]:
    """(``"[section] key"``, default) for every leaf field under ``cls``."""
    for field in attrs.fields(attrs.resolve_types(cls)):
        kind = _unwrap_optional(field.type)
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        inner = f"{path}.{field.name}" if path else field.name
        if attrs.has(kind):
            yield from code_fields(kind, inner)
            continue
        if origin is dict and attrs.has(args[1]):
            yield from code_fields(args[1], f"{inner}.<type>")
            continue
        if origin is list and args and attrs.has(args[0]):
            yield from code_fields(args[0], inner, array=True)
        if field.default is attrs.NOTHING:
            default: Any = REQUIRED
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            default = field.default.factory()
        else:
            default = field.default
        yield f"{_label(path, array)} {field.name}".strip(), default


def _value(text: str) -> Any:
    return tomllib.loads(f"v = {text}")["v"]


def doc_rows() -> Iterator[tuple[str, str, Any]]:
    """(row, ``"[section] key"``, default) for every key the table names."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        key_cell, default_cell = (c.strip() for c in line.strip("|").split(" | ")[:2])
        names = re.findall(r"`([^`]+)`", key_cell)
        assert names, f"no key in row: {line}"
        section, _, first = names[0].rpartition(" ")
        keys = [f"{section} {first}".strip(), *(f"{section} {k}".strip() for k in names[1:])]
        tokens = re.findall(r"`([^`]+)`", default_cell)
        if not tokens:
            assert default_cell in WORDS, f"default {default_cell!r} is not one of {list(WORDS)}"
            defaults = [WORDS[default_cell]] * len(keys)
        elif len(tokens) == 1:
            defaults = [_value(tokens[0])] * len(keys)
        else:
            assert len(tokens) == len(keys), f"{len(keys)} keys, {len(tokens)} defaults: {line}"
            defaults = [_value(t) for t in tokens]
        for key, default in zip(keys, defaults, strict=True):
            yield line, key, default


def _same(doc: Any, code: Any) -> bool:
    if doc is REQUIRED or code is REQUIRED:
        return doc is code
    return type(doc) is type(code) and doc == code


def test_the_walk_sees_every_section() -> None:
    sections = {key.rpartition(" ")[0] for key, _ in code_fields(Config)}
    assert sections >= {
        "", "[node]", "[log]", "[redis]", "[scheduler]", "[execution]", "[consumers.<type>]",
        "[api]", "[[api.keys]]", "[processes]", "[metrics]",
    }  # fmt: skip


def test_every_field_has_a_row_with_its_default() -> None:
    documented: dict[str, Any] = {}
    for _line, key, default in doc_rows():
        assert key not in documented, f"{key} has two rows"
        documented[key] = default
    missing = [key for key, _ in code_fields(Config) if key not in documented]
    assert not missing, f"docs/CONFIGURATION.md lacks rows for: {', '.join(missing)}"
    wrong = [
        f"{key}: the doc says {documented[key]!r}, the code {default!r}"
        for key, default in code_fields(Config)
        if not _same(documented[key], default)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_row_names_a_real_field() -> None:
    known = {key for key, _ in code_fields(Config)}
    unknown = [f"{key} ({line[:60]}...)" for line, key, _ in doc_rows() if key not in known]
    assert not unknown, "rows naming no field:\n" + "\n".join(unknown)
