"""The building blocks of the OpenAPI document's schemas (``actors.api.openapi`` and the
schema tables beside it): common types, the name and entry-id patterns, and the helpers
that write an object, a nullable and a reference the same way everywhere."""

from __future__ import annotations

from typing import Any

from actors.api.bodies import ENTRY_ID_PATTERN
from actors.domain.model import MAX_TASK_ID, STATUSES
from runtime.config import MAX_NAME, NAME_PATTERN

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NAME = {"type": "string", "pattern": f"^{NAME_PATTERN.pattern}$", "maxLength": MAX_NAME}
_TASK_ID = {"type": "string", "pattern": f"^{NAME_PATTERN.pattern}$", "maxLength": MAX_TASK_ID}
_ENTRY_ID = {"type": "string", "pattern": f"^{ENTRY_ID_PATTERN.pattern}$"}
_STATUS = {"enum": list(STATUSES)}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], props: dict[str, Any], extra: bool = False) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": props,
        "additionalProperties": extra,
    }
