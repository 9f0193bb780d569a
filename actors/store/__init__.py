"""The Redis model and the one typed door to it.

Owns every key (``keys``), how a task is stored (``records``), the stream message format
(``messages``), the Lua scripts (``lua/``) and their Python faces (``scripts``: typed
arguments in, typed results or typed errors out, keys built inside), the task store
(``tasks``) and layout migrations (``migrate``). Nothing outside this package builds
script arguments, decodes a script reply, or touches the redis-py client.

May import: ``actors.domain`` and ``runtime`` (checked: ``lint-imports``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any


def _deprecated(name: str) -> Any:
    """``actors.store.TaskStore``, kept for one more release: ``metronome.TaskStore``."""
    if name != "TaskStore":
        raise AttributeError(f"module 'actors.store' has no attribute {name!r}")
    warnings.warn(
        "actors.store.TaskStore is deprecated: use 'from metronome import TaskStore'",
        DeprecationWarning,
        stacklevel=2,
    )
    from actors.store.tasks import TaskStore

    return TaskStore


if not TYPE_CHECKING:
    __getattr__ = _deprecated
