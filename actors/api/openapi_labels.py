"""The OpenAPI schemas of labels (``actors.domain.labels``): a task's labels, and the
listing's ``label`` filter."""

from __future__ import annotations

from typing import Any

from actors.domain.labels import KEY_PATTERN, MAX_LABEL_CHARS, MAX_LABELS, VALUE_PATTERN

LABELS: dict[str, Any] = {
    "type": "object",
    "maxProperties": MAX_LABELS,
    "propertyNames": {
        "pattern": f"^{KEY_PATTERN.pattern}$",
        "maxLength": MAX_LABEL_CHARS,
    },
    "additionalProperties": {
        "type": "string",
        "pattern": f"^{VALUE_PATTERN.pattern}$",
        "maxLength": MAX_LABEL_CHARS,
    },
    "description": f"at most {MAX_LABELS} labels to find the task by (docs/API.md)",
}
LABEL_FILTER: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "string",
        "pattern": f"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_LABEL_CHARS - 1}}}"
        f"=[A-Za-z0-9_.-]{{0,{MAX_LABEL_CHARS}}}$",
    },
    "description": "key=value; repeat it: every one must match",
}
