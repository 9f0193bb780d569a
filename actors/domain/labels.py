"""Labels: a task's small set of string key/value pairs, to find and filter tasks by.

A task has at most ``MAX_LABELS`` labels. A key is 1-63 characters of letters, digits,
``_``, ``.`` and ``-``, starting with a letter or digit; a value 0-63 characters of the
same (it may be empty). Both end up in the names of index keys (``actors.store.keys``), so
neither may hold a brace, a colon or an ``=``. Stored as compact JSON with sorted keys
(``encode_labels``), so one set of labels always has one stored form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from actors.domain.errors import InvalidTask

MAX_LABELS = 16
MAX_LABEL_CHARS = 63
KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
VALUE_PATTERN = re.compile(r"[A-Za-z0-9_.-]*")

_KEY_RULE = (
    f"1-{MAX_LABEL_CHARS} characters of letters, digits, '_', '.' or '-', "
    "starting with a letter or digit"
)
_VALUE_RULE = f"0-{MAX_LABEL_CHARS} characters of letters, digits, '_', '.' or '-'"


def label_key_problem(key: object) -> str | None:
    """Why ``key`` is not a label key, or None."""
    if not isinstance(key, str):
        return f"a label key must be a string, got {type(key).__name__}"
    if len(key) > MAX_LABEL_CHARS or not KEY_PATTERN.fullmatch(key):
        return f"the key {key!r} must be {_KEY_RULE}"
    return None


def label_value_problem(value: object) -> str | None:
    """Why ``value`` is not a label value, or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if len(value) > MAX_LABEL_CHARS or not VALUE_PATTERN.fullmatch(value):
        return f"{value!r} must be {_VALUE_RULE}"
    return None


def check_labels(data: Any, field: str = "labels") -> dict[str, str]:
    """The labels of a body (a JSON object), or InvalidTask naming every bad one
    (``labels.tenant: ...``)."""
    if not isinstance(data, Mapping):
        raise InvalidTask(f"{field}: must be a JSON object, got {type(data).__name__}")
    problems: list[str] = []
    if len(data) > MAX_LABELS:
        problems.append(f"{field}: at most {MAX_LABELS} labels, got {len(data)}")
    for key, value in data.items():
        # A bad key is named in the message, not in the field (it may hold anything).
        problem = label_key_problem(key)
        if problem is not None:
            problems.append(f"{field}: {problem}")
            continue
        problem = label_value_problem(value)
        if problem is not None:
            problems.append(f"{field}.{key}: {problem}")
    if problems:
        raise InvalidTask("; ".join(problems))
    return dict(data)


def encode_labels(labels: Mapping[str, str]) -> str:
    """The stored form: compact JSON, keys sorted; '' for no labels (nothing stored)."""
    if not labels:
        return ""
    return json.dumps(dict(labels), separators=(",", ":"), sort_keys=True)


def decode_labels(raw: bytes | str | None) -> dict[str, str]:
    if not raw:
        return {}
    labels = json.loads(raw)
    if not isinstance(labels, dict):
        raise ValueError(f"labels: stored value is not a JSON object: {raw!r}")
    return {str(k): str(v) for k, v in labels.items()}


def parse_label_filter(text: str, field: str = "label") -> tuple[str, str]:
    """``key=value`` as a filter (or as a CLI flag) -> (key, value), or InvalidTask."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InvalidTask(f"{field}: {text!r} must be key=value")
    problem = label_key_problem(key) or label_value_problem(value)
    if problem is not None:
        raise InvalidTask(f"{field}: {problem}")
    return key, value


def parse_label_filters(texts: list[str], field: str = "label") -> dict[str, str]:
    """Repeated ``key=value`` filters: every one must match, so one key may appear once."""
    pairs: dict[str, str] = {}
    for text in texts:
        key, value = parse_label_filter(text, field)
        if key in pairs and pairs[key] != value:
            raise InvalidTask(f"{field}: {key!r} is given twice with different values")
        pairs[key] = value
    if len(pairs) > MAX_LABELS:
        raise InvalidTask(f"{field}: at most {MAX_LABELS} label filters, got {len(pairs)}")
    return pairs
