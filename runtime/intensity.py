"""Restart intensity and backoff: small pure functions, tested on their own.

OTP semantics: a supervisor may restart its children at most ``max_restarts`` times within
any window of ``period_s`` seconds; one more restart than that and it gives up (and its
parent decides). Between restarts it waits an exponential, capped backoff that grows with
the number of restarts still inside the window, so a quiet period resets it.
"""

from __future__ import annotations


def record_restart(
    history: tuple[float, ...], now: float, max_restarts: int, period_s: float
) -> tuple[tuple[float, ...], bool]:
    """Add a restart at ``now``; return the restarts still inside the window and whether
    the intensity is exceeded.

    >>> record_restart((), 0.0, 1, 5.0)
    ((0.0,), False)
    >>> record_restart((0.0,), 1.0, 1, 5.0)
    ((0.0, 1.0), True)
    >>> record_restart((0.0,), 6.0, 1, 5.0)
    ((6.0,), False)
    """
    # Invariant: history is sorted ascending (restarts are recorded in time order).
    kept = (*tuple(t for t in history if now - t < period_s), now)
    return kept, len(kept) > max_restarts


def backoff_s(restarts_in_window: int, base_s: float, cap_s: float) -> float:
    """``base_s * 2**(n-1)`` capped at ``cap_s``; zero before the first restart.

    >>> [backoff_s(n, 0.1, 1.0) for n in range(6)]
    [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    """
    if restarts_in_window <= 0:
        return 0.0
    # The exponent is capped so a long crash loop never overflows a float.
    return float(min(cap_s, base_s * 2.0 ** min(restarts_in_window - 1, 60)))
