"""Deprecated: import ``HandlerContext``, ``RetryLater`` and ``Unrecoverable`` from
``metronome``. This module re-exports them for one more release."""

from __future__ import annotations

import warnings

from actors.execution.handlers import HandlerContext, RetryLater, Unrecoverable

__all__ = ["HandlerContext", "RetryLater", "Unrecoverable"]

warnings.warn(
    "actors.handlers is deprecated: use 'from metronome import HandlerContext, RetryLater, "
    "Unrecoverable'",
    DeprecationWarning,
    stacklevel=2,
)
