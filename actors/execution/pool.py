"""A type's handler runs: long-lived worker tasks fed from a queue, each run cancelled by
one watchdog when it outlives the type's timeout.

Why not a trio task and a deadline cancel scope per message: at 10,000 fires/s those were
~15 µs of a consumer's ~60 µs a fire (a task object, its coroutine and context, a deadline
in trio's heap). Here a worker takes the next message from a deque (parked while there is
none) and runs it inside a cancel scope it keeps from one message to the next; a new
scope is needed only after a timeout cancelled one. Workers are started as they are
needed, never more than ``size`` (the type's concurrency: the reader asks Redis for no
more messages than there are free slots).

Waking: a batch wakes one worker; each worker woken (or started) wakes up to ``FAN_OUT``
more when its first message leaves others queued that no worker already on its way will
take, and a worker parks only when the queue is empty. A handler that waits (I/O, a
sleep) frees the trio thread for the ones it woke, so ``n`` such runs wake ``n`` workers
and have all started after about ``log2(n)`` scheduler passes; a handler that never waits
lets its worker run the whole batch, and the batch costs two or three wakes, not one a
message (each a park, a reschedule and a task step: a few microseconds of a consumer's CPU
a fire at 10,000 fires/s).

Timeouts: every run of a type has the same timeout, so the busy workers, kept in the order
their current runs started, are also in the order of their deadlines. The watchdog sleeps
until the first one's; it is never woken per message. With nothing running it waits for
the next run to start.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import trio
import trio_util

from actors.execution.completion import Outcome
from actors.execution.running import Runner, now_ms
from actors.store.flights import TRACKED_LETTERS
from actors.store.messages import Message

#: Workers each newly woken worker wakes while messages are still queued (see the module).
FAN_OUT = 2


class HandlerPool:
    """Runs the messages ``submit`` is given, at most ``size`` at once, in ``nursery``.

    ``free`` counts free slots: ``submit`` takes one a message, a finished run (whatever its
    outcome, cancellation included) gives it back, then hands its outcome to ``done``.
    """

    def __init__(
        self,
        runner: Runner,
        size: int,
        free: trio_util.AsyncValue[int],
        done: Callable[[Outcome], None],
        nursery: trio.Nursery,
        actor: str,
    ) -> None:
        self.runner, self.size, self.free, self.done = runner, size, free, done
        self.actor = actor
        self._nursery = nursery
        self._queue: collections.deque[Message] = collections.deque()
        self._idle = trio.lowlevel.ParkingLot()
        self._workers = 0
        self._waking = 0
        """Workers woken or started that have not looked at the queue yet: a fan-out wakes
        only for the messages they will not take."""
        self._busy: dict[trio.CancelScope, float] = {}
        """The deadline of each running handler, by the cancel scope of the worker running
        it, in the order the runs started (dicts keep insertion order; a scope is removed
        when its run ends, added again at its worker's next)."""
        self._idle_watchdog: trio.Event | None = None
        """Set by the next run to start, while the watchdog waits with nothing running."""
        self._replaceable: dict[str, tuple[Message, trio.CancelScope]] = {}
        """Running tracked fires (a task with an overlap policy: ``TRACKED_LETTERS``), by
        message id, with their worker's scope: a ``cancel_other`` fire of the task, its
        own or an operator's, may cancel them (``cancel``)."""
        self._cancelled: set[str] = set()
        """Ids of the messages ``cancel`` cancelled, until their outcome is handed over."""

    def submit(self, messages: list[Message]) -> None:
        """Queue ``messages`` to run. A read asks for no more than the free slots; messages
        taken back (a lost read's, the sweep's) may be more: they wait in the queue, and
        ``free`` goes below zero until they have run, so nothing more is read meanwhile."""
        if not messages:
            return
        self._queue.extend(messages)
        self.free.value -= len(messages)
        self._wake(1)

    def _wake(self, count: int) -> None:
        """Wake up to ``count`` parked workers, and start new ones (up to ``size``) for
        what no parked worker takes."""
        woken = len(self._idle.unpark(count=count))
        started = min(count - woken, self.size - self._workers)
        self._waking += woken + started
        for _ in range(started):
            self._workers += 1
            self._nursery.start_soon(self._work)

    async def _work(self) -> None:
        woken = True  # started for a queued message: it wakes others as a woken worker does
        self._waking -= 1
        try:
            while True:  # one pass per cancel scope: a timeout cancels it for good
                with trio.CancelScope() as scope:
                    while True:
                        while not self._queue:
                            await self._idle.park()
                            woken = True
                            self._waking -= 1
                        message = self._queue.popleft()
                        if woken:
                            woken = False
                            wanted = min(FAN_OUT, len(self._queue) - self._waking)
                            if wanted > 0:
                                self._wake(wanted)
                        if message.policy[:1] in TRACKED_LETTERS:
                            self._replaceable[message.msg_id] = (message, scope)
                        started_ms = now_ms()
                        self._busy[scope] = trio.current_time() + self.runner.timeout_s
                        if self._idle_watchdog is not None:
                            self._idle_watchdog.set()
                            self._idle_watchdog = None
                        try:
                            outcome = await self.runner.run(message, self.actor, started_ms)
                        finally:
                            # Cancelled too (the node stopping): the slot is free again,
                            # and the message stays in flight, released at shutdown.
                            self._busy.pop(scope, None)
                            if message.policy:
                                self._replaceable.pop(message.msg_id, None)
                            self.free.value += 1
                        if scope.cancel_called:
                            break  # timed out, and the handler swallowed the cancellation
                        self.done(outcome)
                # Only a timeout or ``cancel`` leaves the scope: its run's outcome says so.
                if message.msg_id in self._cancelled:
                    self._cancelled.discard(message.msg_id)
                    self.done(Outcome(message, started_ms, now_ms(), not_run="cancelled"))
                else:
                    self.done(self.runner.timed_out(message, started_ms))
        finally:
            self._workers -= 1

    def replaceable(self) -> dict[str, str]:
        """Running fires a newer fire of their task may cancel: schedule_id -> message id."""
        return {m.schedule_id: msg_id for msg_id, (m, _) in self._replaceable.items()}

    def cancel(self, msg_ids: list[str]) -> set[str]:
        """Cancel these runs (a ``cancel_other`` fire replaced them): each one's outcome is
        ``cancelled``, acknowledged and not retried. The ids of the runs cancelled (those
        still running)."""
        cancelled = set()
        for msg_id in msg_ids:
            entry = self._replaceable.pop(msg_id, None)
            if entry is not None:
                self._cancelled.add(msg_id)
                entry[1].cancel()
                cancelled.add(msg_id)
        return cancelled

    async def watch_timeouts(self) -> None:
        """Cancel each run that outlives the timeout (see the module); runs forever."""
        while True:
            if not self._busy:
                self._idle_watchdog = trio.Event()
                await self._idle_watchdog.wait()
                continue
            scope, deadline = next(iter(self._busy.items()))
            if deadline > trio.current_time():
                await trio.sleep_until(deadline)
                continue
            del self._busy[scope]
            scope.cancel()
