"""Small helpers of the task store: where a new schedule's first grid time goes, where a
resumed task's goes, and where a listing stands between two pages."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import attrs

from actors.domain.errors import InvalidTask
from actors.domain.misfires import paused_past
from actors.domain.model import Task
from actors.domain.schedules import Schedule
from actors.store.keys import schedule_id
from actors.store.records import encode_schedule


class Placement:
    """A task's schedule as stored and its first grid time as script arguments (creates,
    updates). ``H`` cron fields are resolved from the task id here, so what is stored is
    concrete. In one bulk create thousands of tasks usually share a handful of schedules,
    so each distinct one is encoded and placed once (the spread and the jitter are still
    added per task: ``Schedule.score_ms``)."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self._seen: dict[Schedule, tuple[bytes, int | None]] = {}

    def of(self, schedule: Schedule, task_id: str) -> tuple[bytes, int | None, int | None]:
        """(stored schedule, next_ms, score); None when it never fires."""
        schedule = schedule.for_task(task_id)
        known = self._seen.get(schedule)
        if known is None:
            known = (encode_schedule(schedule), schedule.first_due(self.now_ms))
            self._seen[schedule] = known
        sched, due = known
        if due is None:
            return sched, None, None
        return sched, due, schedule.score_ms(due, task_id)


@attrs.frozen
class KeptGrid:
    """An update whose schedule keeps the task's grid (``Schedule.same_grid``: a bound, a
    policy, the jitter or the spread changed): the task keeps its next grid time, its fire
    count and the latest grid time its claims decided, so a finished one-shot does not
    fire again, an interval keeps its phase and ``max_runs`` counts on. It is placed from
    the task's schedule as read: ``update_task.lua`` answers CONFLICT when another update
    has replaced that since, and ``TaskStore.update`` reads and places again."""

    delay_ms: int
    """The spread offset and a jitter draw: the kept grid time's score is it plus them."""
    end_ms: int | None
    max_runs: int | None
    revive_ms: int | None
    """Where a task with no grid time left to plan goes (finished, or parked on a time
    its claims decided): the grid's next time after now within the new bounds, as a
    resume places it; a one-shot that never fired, its time. None (runs spent, a
    one-shot that fired): none, it finishes."""
    revive_score: int | None
    fires: int
    """The fire count the revival was placed from: the script revives only while the
    task's count is still it (a poller's commit in between moved the task on)."""
    ended: bool
    """The task's grid had ended at its next time as read (a task parked on a time its
    claims decided, for fires waiting behind it): that time is not planned again. Another
    decided time (a claim whose commit an API write refused) stays, to be counted."""


def kept_grid(
    task: Task, schedule: Schedule, now_ms: int, grid_ms: int | None = None
) -> KeptGrid | None:
    """For an update of ``task`` to ``schedule`` (resolved for it) on the same grid, what
    the script keeps; None when the grid changes. ``grid_ms``: a time on the grid of an
    interval without ``start_ms`` whose state holds none (``backfill_window.grid_of``)."""
    if not task.schedule.same_grid(schedule):
        return None
    return KeptGrid(
        schedule.offset_ms(task.task_id) + schedule.jitter_ms(),
        schedule.end_ms,
        schedule.max_runs,
        *_revival(task, schedule, now_ms, grid_ms),
        task.fires,
        _ended_at_next(task),
    )


def _ended_at_next(task: Task) -> bool:
    """Whether the task's grid has no time after its next one (its runs spent, past its
    end, a one-shot's): a task kept scheduled on it is parked."""
    old, next_ms = task.schedule, task.next_run_ms
    if next_ms is None:
        return False
    spent = old.max_runs is not None and task.fires >= old.max_runs
    return spent or old.next_after(next_ms) is None


def _revival(
    task: Task, schedule: Schedule, now_ms: int, grid_ms: int | None
) -> tuple[int | None, int | None]:
    if schedule.max_runs is not None and task.fires >= schedule.max_runs:
        return None, None
    if schedule.kind == "once":
        if task.fires:  # it fired: a one-shot's grid has no time left
            return None, None
        due = schedule.first_due(now_ms)
        return (None, None) if due is None else (due, schedule.score_ms(due, task.task_id))
    # On the grid: through its start, else a time it fired on (a finished task's
    # history), else its next (parked on a time its claims decided), else from now.
    anchor = schedule.start_ms if schedule.kind == "interval" else None
    anchor = anchor or grid_ms or task.next_run_ms
    return resume_point(attrs.evolve(task, schedule=schedule, next_run_ms=anchor), now_ms)


def paused_skips(task: Task, now_ms: int, decided_ms: int | None = None) -> tuple[int, int] | None:
    """The grid times a paused task's pause skipped, resumed at ``now_ms``: (how many,
    the last of them), None when none (``actors.domain.misfires.paused_past``). Only
    those after ``decided_ms``, the latest grid time its flight decided (a task with an
    overlap policy: its next time may be one decided already, run or waiting: a task
    parked on it, or paused between a claim and its commit)."""
    first = task.next_run_ms
    if first is not None and decided_ms is not None and first <= decided_ms:
        first = task.schedule.next_after(decided_ms)
    count, last = paused_past(task.schedule, first, now_ms, task.fires)
    return None if last is None else (count, last)


def paused_line(task: Task, skipped: tuple[int, int]) -> tuple[str, dict[str, Any]]:
    """The ``not_run`` line of the grid times a resume found its pause skipped: one line
    for them all (a long pause of a frequent task skips millions), with their count and
    the last of them."""
    count, last = skipped
    return (
        "not_run",
        {
            "task_id": task.task_id,
            "schedule_id": schedule_id(task.task_id, last),
            "type": task.type,
            "due_ms": last,
            "reason": "paused",
            "count": count,
        },
    )


def resume_point(task: Task, now_ms: int) -> tuple[int | None, int | None]:
    """Where a resumed task goes: (next grid time, its score), None when it never fires
    again. On the grid: the next grid time after now, as if it had never paused (the pause
    skipped the fires in between, which is what pausing means). A task that has made its
    ``max_runs`` fires has none (a claim made before the pause may have made the last)."""
    max_runs = task.schedule.max_runs
    if max_runs is not None and task.fires >= max_runs:
        return None, None
    grid = task.next_run_ms or task.schedule.first_due(now_ms)
    next_ms = grid if grid is None or grid > now_ms else task.schedule.first_after(grid, now_ms)
    if next_ms is None:
        return None, None
    return next_ms, task.schedule.score_ms(next_ms, task.task_id)


@attrs.frozen
class ListCursor:
    """Where a listing stands: which index (of the types listed, or the label index),
    partition, next bucket, and in that bucket the last task id a page ended on (a
    bucket's ids are listed in order, so a page holds ``limit`` tasks at most). Opaque to
    clients. A listing of every type names the type too (``t-p-b-<type>``): the types are
    read again for each page, and a type created meanwhile moves the others' places. The
    id follows the first ``~`` (a type holds none)."""

    type_index: int
    partition: int
    bucket: int
    after: str | None = None
    """Ids up to this one in ``bucket`` were listed already."""

    @classmethod
    def parse(
        cls, text: str | None, types: int, partitions: int, buckets: int,
        names: Sequence[str] | None = None,
    ) -> ListCursor | None:  # fmt: skip
        """``names``: the types a listing of every type walks, in order (sorted)."""
        if not types:
            return None
        if text is None:
            return cls(0, 0, 0)
        place, tilde, after = text.partition("~")
        parts = place.split("-", 3)
        try:
            t, p, b = (int(x) for x in parts[:3])
            if tilde and not after:
                raise ValueError("no task id after '~'")
        except ValueError:
            raise InvalidTask(f"cursor: {text!r} is not a cursor this listing returned") from None
        named = len(parts) == 4
        if named and names is None:  # an unfiltered listing's, given to another
            raise InvalidTask(f"cursor: {text!r} is not a cursor this listing returned")
        if not (0 <= p < partitions and 0 <= b < buckets and (named or 0 <= t < types)):
            raise InvalidTask(f"cursor: {text!r} is out of range")
        if named and names is not None:
            t = bisect.bisect_left(names, parts[3])  # where its type is, or would be
            if t == len(names):
                return None  # its type and every one after it are gone: the listing is done
            if names[t] != parts[3]:  # its type is gone: on with the next one, from its start
                return cls(t, 0, 0)
        return cls(t, p, b, after if tilde else None)

    def advance(self, bucket: int, types: int, partitions: int, buckets: int) -> ListCursor | None:
        """The position after reading up to ``bucket`` (exclusive), or None at the end."""
        if bucket < buckets:
            return ListCursor(self.type_index, self.partition, bucket)
        if self.partition + 1 < partitions:
            return ListCursor(self.type_index, self.partition + 1, 0)
        if self.type_index + 1 < types:
            return ListCursor(self.type_index + 1, 0, 0)
        return None

    def format(self, names: Sequence[str] | None = None) -> str:
        place = f"{self.type_index}-{self.partition}-{self.bucket}"
        if names is not None:
            place = f"{place}-{names[self.type_index]}"
        return place if self.after is None else f"{place}~{self.after}"
