"""Overlap policies, catch-up windows and failure limits: the tasks' fires in flight.

A task whose schedule sets ``overlap`` (other than ``allow_all``), ``catchup_window_s`` or
``pause_after_failures`` has its fires carry a short policy code in their stream message
(field ``o``; ``policy_code``), so the consumer that ends one knows to tell the task's
partition (``end_flights.lua``) without reading the task. The code also carries what the
task's history needs and its message does not say: a manual fire's origin (``;m``:
trigger, backfill, replay), how late a fire of a task with a spread or a jitter may
start and still be on time (``;l``), and which creation of a task with a failure limit
the fire is of (``;b``: a task deleted and created again under its id counts no dead
end of the earlier one's). Every other fire carries nothing and costs nothing more.

In the partition's slot, a flight record per task (``lua/flight.lua``) holds the due
time of its fire in flight (from enqueue until acknowledged, dead-lettered or out of
retries), the due times waiting behind it (``buffer_one``, ``buffer_all``) and its dead
streak. The poller asks ``overlap.lua`` which planned fires start (one call per partition,
only for such tasks), and the consumers' completions end them, atomically each: a node's
memory never decides an overlap, and a node killed mid-run strands nothing (its message is
reclaimed and ends elsewhere, or is dead-lettered, and that ends the flight).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from actors.domain.schedules import Schedule
from actors.store import lua
from actors.store.codes import TRACKED_POLICIES, flag
from actors.store.history import DEFAULT_HISTORY
from actors.store.keys import schedule_id
from actors.store.queue_rows import stored_number
from actors.store.replies import Fire
from actors.store.task_scripts import (
    Call,
    TaskScripts,
    parse_time,
    parse_times,
    raise_first_error,
    set_apart,
)
from runtime.redis_replies import PartRejected

#: Policy letters as messages and ``overlap.lua`` carry them.
LETTERS = {"allow_all": "A", "skip": "S", "buffer_one": "1", "buffer_all": "B",
           "cancel_other": "C"}  # fmt: skip
#: The letters of the policies whose fires are tracked (in flight, one at a time): any of
#: them may be cancelled by a ``cancel_other`` fire, the task's own or an operator's
#: trigger or backfill under ``cancel_other`` (whatever the task's own policy). The
#: scripts read them as ``TRACKED_POLICIES``.
TRACKED_LETTERS = frozenset(TRACKED_POLICIES)
#: Most due times a ``buffer_all`` task keeps waiting; later ones are not run (``overlap``).
BUFFER_CAP = 1000
#: A poller's claim lease by default (``[scheduler] claim_lease_ms``): until it has passed,
#: a poller that put a fire in flight unconfirmed may be alive and on its way to its append.
DEFAULT_CLAIM_LEASE_MS = 10_000
#: How long a cancel request waits for the fire it names (ms): a fire waiting for a retry
#: may start this late.
CANCEL_KEEP_MS = 86_400_000
#: How a fire ended, as ``end_flights.lua`` reads it (0 and 2 as ``records.OUTCOME_NAMES``).
ENDED_OK, ENDED_DEAD, ENDED_CANCELLED, ENDED_EXPIRED, ENDED_DROPPED = 0, 2, 3, 4, 5


def dropped_lines(
    task_id: str, task_type: str, dues: Sequence[int], reason: str
) -> list[tuple[str, Any]]:
    """The ``not_run`` lines of fires that waited behind the task's fire in flight and
    that nothing will start (``drop_waiting`` in ``flight.lua``, which notes them in the
    not-run record): ``stopped``, the task was stopped; ``updated``, it was given a
    schedule without an overlap policy."""
    return [
        ("not_run", {"task_id": task_id, "schedule_id": schedule_id(task_id, due),
                     "type": task_type, "due_ms": due, "reason": reason})
        for due in dues
    ]  # fmt: skip


@functools.lru_cache(maxsize=4096)
def policy_code(schedule: Schedule) -> str:
    """The code a fire of ``schedule`` carries in its message: '' for a plain schedule,
    else the overlap letter, then ``;w<ms>`` (catch-up window) and ``;p<n>`` (failures);
    ``task_policy_code`` adds what is the task's own (its creation, its allowance)."""
    window, failures = schedule.catchup_window_s, schedule.pause_after_failures
    if schedule.overlap == "allow_all" and window is None and failures is None:
        return ""
    code = LETTERS[schedule.overlap]
    if window is not None:
        code += f";w{max(1, round(window * 1000))}"
    if failures is not None:
        code += f";p{failures}"
    return code


#: How a policy code marks a manual fire's origin (``;m`` and the origin's letter): a
#: fire an operator triggered, backfilled or replayed (``actors.store.history.ORIGINS``).
ORIGIN_LETTERS = {"t": 1, "b": 2, "r": 3}
#: ``ORIGIN_LETTERS`` the other way: an origin's letter.
LETTER_OF_ORIGIN = {origin: letter for letter, origin in ORIGIN_LETTERS.items()}


def with_origin(code: str, letter: str) -> str:
    """A manual fire's policy code: its task's (or ``A`` for none) marked with its origin."""
    return f"{code or 'A'};m{letter}"


def origin_of(code: str) -> int:
    """The origin a fire's policy code marks (0: its schedule)."""
    at = code.rfind(";m")
    return ORIGIN_LETTERS.get(code[at + 2 : at + 3], 0) if at >= 0 else 0


def origin_and_allowance(code: str) -> tuple[int, int]:
    """A fire's origin (``origin_of``) and the lateness its start is allowed (``;l``: its
    task's spread and jitter bound, ms; 0 when none)."""
    at = code.find(";l")
    if at < 0:
        return origin_of(code), 0
    end = code.find(";", at + 2)
    return origin_of(code), stored_number(code[at + 2 : end if end >= 0 else len(code)]) or 0


def allowance_ms(schedule: Schedule, task_id: str) -> int:
    """How late a fire of this task may start and still be on time: its spread offset and
    the most its jitter delays it (a fire's own jitter draw is not in its message)."""
    return schedule.offset_ms(task_id) + round((schedule.jitter_s or 0) * 1000)


@attrs.frozen
class Policy:
    """A message's policy code, read (``parse_policy``)."""

    letter: str = "A"
    window_ms: int | None = None
    pause_after: int | None = None
    offset_ms: int = 0
    """How late the task's fires may be enqueued by design (its spread offset and jitter
    bound; a message of an earlier version: the spread offset): a fire's lateness counts
    from its grid time plus it."""
    born: int | None = None
    """The creation version of the task the fire is of (``task_policy_code``; None when
    not carried)."""

    def expired(self, due_ms: int, now_ms: int) -> bool:
        """Whether a fire of grid time ``due_ms`` is later than the catch-up window."""
        return self.window_ms is not None and now_ms - due_ms - self.offset_ms > self.window_ms

    @property
    def tracked(self) -> bool:
        """Whether its fires are in flight records (any policy but ``allow_all``)."""
        return self.letter != "A"


@functools.lru_cache(maxsize=16384)  # a code per task with a failure limit (;b) or a spread
def parse_policy(code: str) -> Policy:
    """A policy code as ``policy_code`` writes it; an unknown part is ignored (a newer
    version's), an unreadable one leaves the fire plain."""
    letter, *parts = code.split(";")
    window = failures = born = None
    offset = 0
    for part in parts:
        kind, number = part[:1], stored_number(part[1:])  # not a number: as if absent
        if number is None:
            continue
        if kind == "w":
            window = number
        elif kind == "p":
            failures = number
        elif kind == "s":
            offset = number
        elif kind == "b":
            born = number
    return Policy(letter if letter in LETTERS.values() else "A", window, failures, offset, born)


def task_policy_code(schedule: Schedule, task_id: str, created_ms: int = 0) -> str:
    """``policy_code`` for one task's fires: with a spread or a jitter, the lateness its
    start is allowed (``;l<ms>``: ``allowance_ms``), so the attention list does not call
    it late, and with a catch-up window too, the same as how late the fire may be
    enqueued by design (``;s<ms>``), so a claim and a consumer judge expiry from the
    latest it was due to be enqueued (a jitter longer than the window would otherwise
    expire fires that were on time); with a failure limit, the task's creation version
    (``;b<ms>``, when known), so the end of a fire of a task deleted since counts in no
    dead streak of one created again under its id (``end_flights.lua``)."""
    code = policy_code(schedule)
    if created_ms and schedule.pause_after_failures is not None:
        code += f";b{created_ms}"
    allowed = allowance_ms(schedule, task_id)
    if allowed and schedule.catchup_window_s is not None:
        code += f";s{allowed}"
    if allowed:
        code = f"{code or 'A'};l{allowed}"
    return code


@attrs.frozen
class Planned:
    """A claimed task's fires as the misfire policy and the catch-up window left them."""

    task_id: str
    letter: str
    dues: Sequence[int]
    expired: Sequence[int] = ()
    ends: bool = False
    """The plan ends the task's grid (no grid time after these)."""
    task_type: str = ""
    """The task's type (the attention list's entry names it)."""
    version: int = 0
    """The task's version as its claim read it (``Claimed.updated_ms``): a poller's
    decision for a task an API write changed since (``decide_overlaps``' ``writes``)
    decides nothing."""


@attrs.frozen
class Decision:
    """Which of a task's planned fires start now (``overlap.lua``)."""

    run: list[tuple[int, bool]]
    """(due time, fresh): fresh is False for a fire an earlier decision put in flight and
    never confirmed, whose copy the enqueue may find appended already (then that copy is
    the one in flight)."""
    cancel: list[int]
    skipped: list[int]
    blocking: int | None
    park: int | None = None
    """The grid ended with fires still waiting: the task stays scheduled (at this time,
    its latest grid time decided or, none decided, the decision's; woken when the fire in
    flight ends) until they have started."""
    manual: frozenset[int] = frozenset()
    """Due times in ``run`` an operator's trigger or backfill held back: they run with the
    policy's letter alone (no catch-up window, no failure count)."""
    wait_ms: int | None = None
    """Nothing decided: the claim's times include the task's fire in flight, which another
    decider put there unconfirmed and may still append; decide again this long after."""
    known: frozenset[int] = frozenset()
    """Expired times not noted as not run because they were decided before: the park
    time, a time in flight or waiting before the call, or one up to the latest decided
    that the task's history holds with a fate other than expired."""
    counted: int = 0
    """How many of the claim's times were counted in the task's fires before: a parked
    task's wake plans its park time again (the claim that parked it counted it)."""


def _decision(reply: list[Any]) -> Decision:
    _, run, cancel, skipped, blocking, park, wait, *rest = reply
    started: list[tuple[int, bool]] = []
    manual = set()
    for entry in run.split(b","):
        due = parse_time(entry.lstrip(b"rm"))
        if due is not None:  # what is not a time (a record edited by hand) is left out
            started.append((due, not entry.startswith(b"r")))
            if entry.lstrip(b"r").startswith(b"m"):
                manual.add(due)
    return Decision(
        started, parse_times(cancel), parse_times(skipped), parse_time(blocking),
        parse_time(park), frozenset(manual), parse_time(wait),
        frozenset(parse_times(rest[0])) if rest else frozenset(),
        rest[1] if len(rest) > 1 and isinstance(rest[1], int) else 0,
    )  # fmt: skip


@attrs.frozen
class FlightEnd:
    """A tracked fire that ended (or was found a duplicate): ``ended`` is an ``ENDED_*``."""

    task_id: str
    ended: int
    due_ms: int
    pause_after: int | None = None
    error: str = ""
    born: int | None = None
    """The creation version of the fire's task (``Policy.born``; None: not known)."""


class FlightScripts(TaskScripts):
    """The scripts of fires in flight."""

    async def decide_overlaps(
        self,
        token: str,
        planned: Mapping[int, Sequence[Planned]],
        grid: bool = True,
        history: int = DEFAULT_HISTORY,
        takeover_ms: int = 0,
        rejected: list[PartRejected] | None = None,
        writes: Mapping[int, int] | None = None,
    ) -> dict[str, Decision]:
        """``overlap.lua`` per partition: the decision for every planned task, by id.
        ``token``: the claim's (confirmed by its commit) or the operator call's (confirmed
        by ``confirm_flights``); ``grid``: a poller's claim of grid times (those not run
        go into the tasks' histories, ``history`` entries kept); ``takeover_ms``: how old
        another decider's unconfirmed fire must be to be appended again here (its decider
        taken as dead: the claim lease; before, it may be on its way to its append);
        ``rejected``: a partition whose call Redis rejects (its keys of another kind) goes
        there as ``PartRejected``, its tasks left undecided (without it the first error is
        raised); ``writes``: each partition's count of API writes as its claim read it
        (``PartitionClaim.writes``): when an API write came since, a task whose version is
        no longer ``Planned.version`` (updated, paused, resumed, stopped, deleted) is not
        decided for (its ``wait_ms`` is 1: its commit finds it changed and leaves it to
        its next claim), so no decision of a definition gone is written over the flight
        record the write reset."""
        calls: list[Call] = []
        for partition, tasks in planned.items():
            claimed = "" if writes is None else writes.get(partition, "")
            args: list[Any] = [BUFFER_CAP, token, flag(grid), self.keys.tag(partition),
                               history, self.keys.buckets, takeover_ms, claimed]  # fmt: skip
            for t in tasks:
                args += [t.task_id, t.task_type, t.letter, flag(t.ends), t.version,
                         len(t.dues), len(t.expired), *t.dues, *t.expired]  # fmt: skip
            keys = [self.keys.flights(partition), self.keys.not_run(partition)]
            calls.append((lua.OVERLAP, keys, args))
        decisions: dict[str, Decision] = {}
        replies = await self.client.mixed_scripts(calls) if calls else []
        _, replies = set_apart(list(planned), replies, rejected)
        raise_first_error(replies)
        for reply in replies:
            for item in reply:
                decisions[item[0].decode()] = _decision(item)
        return decisions

    async def latest_decided(self, task_ids: Sequence[str]) -> dict[str, int]:
        """The latest grid time each task's flight decided (its record's last field: in
        flight, waiting, skipped or run), for the tasks that have one, in one round trip:
        a resume counts only the grid times after it as skipped by the pause."""
        if not task_ids:
            return {}
        k = self.keys
        raws = await self.client.pipeline(
            [("HGET", k.flights(k.partition_of(t)), t) for t in task_ids]
        )
        out = {}
        for task_id, raw in zip(task_ids, raws, strict=True):
            if isinstance(raw, bytes) and b"|" in raw:  # another kind of value: none known
                decided = stored_number(raw.rpartition(b"|")[2])
                if decided is not None:
                    out[task_id] = decided
        return out

    async def confirm_flights(self, token: str, task_ids: Sequence[str]) -> None:
        """``confirm_flights.lua``: an operator's call appended the fires it put in flight."""
        by: dict[int, list[str]] = defaultdict(list)
        for task_id in task_ids:
            by[self.keys.partition_of(task_id)].append(task_id)
        await self._run(
            [(lua.CONFIRM_FLIGHTS, [self.keys.flights(p)], [token, *ids]) for p, ids in by.items()]
        )

    async def cancel_fires(self, by_type: Mapping[str, Sequence[str]]) -> None:
        """``cancel_fires.lua`` per type: ask its consumers to cancel these fires."""
        await self._run(
            [
                (lua.CANCEL_FIRES, [self.keys.cancels(t)], [CANCEL_KEEP_MS, *sids])
                for t, sids in by_type.items()
                if sids
            ]
        )

    async def cancel_requests(self, task_type: str, sids: Sequence[str]) -> list[str]:
        """Which of ``sids`` a cancel request names (read only: ``take_cancel_requests``
        removes them once their runs are cancelled, so a repeat after a lost reply finds
        them still). A request its fire ended before taking goes with the fire's ACK
        (``ack.lua``)."""
        if not sids:
            return []
        found = await self.client.execute("HMGET", self.keys.cancels(task_type), *sids)
        return [sid for sid, at in zip(sids, found, strict=True) if at is not None]

    async def take_cancel_requests(self, task_type: str, sids: Sequence[str]) -> None:
        """Remove these cancel requests: their runs are cancelled (a repeat removes none)."""
        if sids:
            await self.client.execute("HDEL", self.keys.cancels(task_type), *sids)

    def end_flight_calls(self, ends: Sequence[FlightEnd]) -> list[Call]:
        """``end_flights.lua`` calls, one per partition."""
        by: dict[int, list[FlightEnd]] = defaultdict(list)
        for e in ends:
            by[self.keys.partition_of(e.task_id)].append(e)
        return [self.end_flight_call(partition, items) for partition, items in by.items()]

    def end_flight_call(self, partition: int, ends: Sequence[FlightEnd]) -> Call:
        """The ``end_flights.lua`` call of ``partition``'s fires in ``ends``."""
        k = self.keys
        args: list[Any] = [k.tag(partition)]
        for e in ends:
            args += [e.task_id, k.bucket_of(e.task_id), e.ended, e.due_ms,
                     "" if e.pause_after is None else e.pause_after, e.error,
                     "" if e.born is None else e.born]  # fmt: skip
        keys = [k.schedule(partition), k.flights(partition), k.notes(partition),
                k.not_run(partition)]  # fmt: skip
        return (lua.END_FLIGHTS, keys, args)

    async def end_flights(self, ends: Sequence[FlightEnd]) -> list[tuple[str, int]]:
        """``end_flights.lua``: end these fires; the tasks it paused, with their streaks."""
        return paused_of(await self._run(self.end_flight_calls(ends)))


def paused_of(replies: Sequence[Any]) -> list[tuple[str, int]]:
    """The (task_id, dead streak) of the tasks ``end_flights.lua`` replies say it paused."""
    out = []
    for reply in replies:
        for i in range(0, len(reply), 2):
            out.append((reply[i].decode(), int(reply[i + 1])))
    return out


def ended_flights(flat: Sequence[Any], ended: int, width: int = 3) -> list[FlightEnd]:
    """``FlightEnd``s from a script's flat list of (task_id, due_ms, policy code, ...:
    ``width`` values each) of messages it removed (poison, a purge), for the tasks whose
    fires are tracked."""
    out = []
    for i in range(0, len(flat), width):
        task_id, due, code = flat[i : i + 3]
        policy = parse_policy(code.decode())
        if policy.tracked or policy.pause_after is not None:
            out.append(
                FlightEnd(task_id.decode(), ended, int(due), policy.pause_after,
                          born=policy.born)
            )  # fmt: skip
    return out


async def end_dropped_flights(scripts: FlightScripts, dropped: list[Fire]) -> None:
    """A tracked fire put in flight afresh whose copy the enqueue found appended
    already (its earlier claim's poller died after appending it, and it has run and
    ended since): its flight ends here, or it would wait on a fire that ran."""
    ends = [
        FlightEnd(f.task_id, ENDED_DROPPED, f.due_ms)
        for f in dropped
        if f.fresh and parse_policy(f.policy).tracked
    ]
    if ends:
        await scripts.client.ride_out(lambda: scripts.end_flights(ends))
