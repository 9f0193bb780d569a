"""What Redis holds for a task, read with plain commands (tests assert on Redis itself)."""

from __future__ import annotations

import json
from typing import Any

from actors.store.codes import DEFINITION_VALUES
from actors.store.keys import Keys
from actors.store.records import unpack


def definition(db: Any, keys: Keys, task_id: str) -> list[Any] | None:
    """The stored definition (type, payload JSON, schedule, created_ms), or None."""
    raw = db.hget(keys.definitions(keys.partition_of(task_id), keys.bucket_of(task_id)), task_id)
    return None if raw is None else unpack(raw, DEFINITION_VALUES)


def exists(db: Any, keys: Keys, task_id: str) -> bool:
    return definition(db, keys, task_id) is not None


def payload(db: Any, keys: Keys, task_id: str) -> Any:
    stored = definition(db, keys, task_id)
    return None if stored is None else json.loads(stored[1])
