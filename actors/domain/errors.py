"""The typed errors of task operations (``actors.store.codes`` maps script codes to them)."""

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
