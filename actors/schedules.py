"""Deprecated: import ``Schedule`` from ``metronome``. This module re-exports it for one
more release."""

from __future__ import annotations

import warnings

from actors.domain.schedules import Schedule

__all__ = ["Schedule"]

warnings.warn(
    "actors.schedules is deprecated: use 'from metronome import Schedule'",
    DeprecationWarning,
    stacklevel=2,
)
