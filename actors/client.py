"""Deprecated: import ``Client``, ``AsyncClient``, ``ApiError`` and ``ApiUnavailable``
from ``metronome``. This module re-exports them for one more release."""

from __future__ import annotations

import warnings

from actors.admin.client import ApiError, ApiUnavailable, AsyncClient, Client

__all__ = ["ApiError", "ApiUnavailable", "AsyncClient", "Client"]

warnings.warn(
    "actors.client is deprecated: use 'from metronome import Client' (AsyncClient, ApiError, "
    "ApiUnavailable likewise)",
    DeprecationWarning,
    stacklevel=2,
)
