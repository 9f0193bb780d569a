"""Deprecated: import ``TaskSpec`` and ``Task`` from ``metronome``. This module re-exports
them for one more release."""

from __future__ import annotations

import warnings

from actors.domain.model import Task, TaskSpec

__all__ = ["Task", "TaskSpec"]

warnings.warn(
    "actors.model is deprecated: use 'from metronome import TaskSpec, Task'",
    DeprecationWarning,
    stacklevel=2,
)
