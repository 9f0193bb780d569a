"""Errors of the task store, and the one table mapping Lua return codes to them."""

from __future__ import annotations


class TaskError(Exception):
    """Base of the errors a store operation reports about a task."""


class InvalidTask(TaskError, ValueError):
    """A task definition or update is invalid; the message names the field. Nothing written."""


class TaskNotFound(TaskError, KeyError):
    def __init__(self, task_id: str) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"task {self.task_id!r} not found"


class TaskConflict(TaskError):
    """A create with a client-given id that exists with a different definition."""


class InvalidTransition(TaskError):
    """E.g. resuming a stopped task."""


class LayoutMismatch(TaskError):
    """The namespace was written by an incompatible version of Metronome."""


#: Script return codes (see the header of each script in ``actors/store/lua``).
OK = 1
UNCHANGED = 0
CONFLICT = -1
NOT_FOUND = -2
BAD_TRANSITION = -3


def raise_for_code(code: int, task_id: str, detail: str = "") -> None:
    """Turn a script's return code into the typed error, or return for success codes."""
    if code in (OK, UNCHANGED):
        return
    if code == NOT_FOUND:
        raise TaskNotFound(task_id)
    if code == CONFLICT:
        raise TaskConflict(f"task {task_id!r} exists with a different type, payload or schedule")
    if code == BAD_TRANSITION:
        raise InvalidTransition(f"task {task_id!r}: {detail}")
    raise RuntimeError(f"unexpected script code {code} for task {task_id!r}")
