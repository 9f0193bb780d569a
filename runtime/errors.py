"""The runtime's exceptions, named by what the caller must do about them.

- ``ConfigError``: the node cannot start until a human fixes its configuration.
- ``RuntimeStartError``: a resource the node needs (a Redis binary, a port) is missing.
- ``RestartIntensityExceeded``: a supervisor gave up; its parent decides what happens next.
- ``ChildProcessFailed``: a part of the node running as a child process exited with an
  error status; like any crash, its supervisor restarts it.
- ``GiveUpNow``: a failure no restart mends (a child refusing the node's changed config):
  every supervisor above it gives up at once.
- ``RedisUnavailable``: Redis could not be reached, timed out, or answered that it cannot
  serve for a moment (loading, busy, changing roles). Actors wait it out
  (``RedisClient.ride_out``); the API answers 503.
- ``RedisRefused``: Redis is up and refused a command: writes refused (``OOM``,
  ``MISCONF``, ``NOREPLICAS``) or a permission missing. Actors repeat the step with
  backoff and one clear line (``runtime.redis_replies`` classifies every reply).
"""

from __future__ import annotations


class ConfigError(Exception):
    """Invalid node configuration. The message names the file, the key path and the problem."""


class RuntimeStartError(Exception):
    """Something the node needs to start is missing; the message says how to get it."""


class RestartIntensityExceeded(Exception):
    """A supervisor saw more restarts within its period than its intensity allows."""

    def __init__(self, path: str, restarts: int, period_s: float) -> None:
        super().__init__(
            f"supervisor {path} gave up: more than {restarts} restarts in {period_s:g}s"
        )
        self.path = path
        self.restarts = restarts
        self.period_s = period_s


class RestartAttemptsExceeded(RestartIntensityExceeded):
    """A child kept failing, slower than the intensity window notices, past the supervisor's
    ``max_attempts`` restarts in a row without staying up a full period."""

    def __init__(self, path: str, child: str, attempts: int, period_s: float) -> None:
        Exception.__init__(
            self,
            f"supervisor {path} gave up: {child} failed {attempts} restarts in a row "
            f"without staying up {period_s:g}s",
        )
        self.path = path
        self.restarts = attempts
        self.period_s = period_s


class ChildProcessFailed(Exception):
    """A child process of the node (``runtime.process``) exited with a non-zero status."""


class GiveUpNow(Exception):
    """A child failed in a way no restart mends: a child process refusing its node's
    config, changed on disk since the node started (``runtime.process``). Its supervisor
    stops its children and gives up at once, and so does each one above it: the node
    exits 1, to be started again whole by its service manager."""


class ChildProcessGaveUp(ChildProcessFailed):
    """A child process's own tree gave up (``runtime.process.EXIT_PART_GAVE_UP``): a crash
    loop in there, however long it took, counts toward its parent's giving up."""


class RedisUnavailable(Exception):
    """Redis did not answer (connection refused or lost, timeout), or answered that it
    cannot serve for a moment (``LOADING``, ``BUSY``, a server changing roles)."""


class RedisRefused(RedisUnavailable):
    """Redis answered, and refused the command (``runtime.redis_replies``): ``kind`` is
    ``refused_write``, ``permission`` or ``rejected``; ``fix`` says what an operator does."""

    def __init__(self, kind: str, message: str, fix: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.fix = fix
