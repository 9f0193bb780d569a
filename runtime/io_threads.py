"""Worker threads that run blocking calls for trio, cheaper than ``trio.to_thread``.

Why not ``trio.to_thread.run_sync``: on a 2-core machine it costs ~160 us per call even for
a no-op (thread-cache handoff, limiter, context copy); a fixed set of threads fed by one
``SimpleQueue``, answering through ``TrioToken.run_sync_soon``, costs ~60 us. Redis calls
are the node's hottest path, so the difference is real throughput.

Semantics:
- at most ``size`` calls run at once (one per thread); more wait in the queue, in order;
- cancelling a waiting trio task abandons its call at once: the call may still run (it
  cannot be interrupted; its socket timeout bounds it), and its result is dropped;
- ``close()`` stops the threads after the calls already queued (abandoned ones included);
- ``wait_abandoned()`` waits until every abandoned call that had started has ended (one
  queued but not started is never run): for a caller whose next step must not race a
  write it gave up on (a poller releasing its partitions after an enqueue it abandoned).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")


class _Call:
    __slots__ = ("abandoned", "ended", "fn", "task", "token")

    def __init__(
        self, fn: Callable[[], Any], task: trio.lowlevel.Task, token: trio.lowlevel.TrioToken
    ) -> None:
        self.fn = fn
        self.task = task
        self.token = token
        # Invariant: read and written only on the trio thread (abort and _deliver run there);
        # the worker may read it as a hint to skip a call nobody waits for.
        self.abandoned = False
        self.ended = threading.Event()
        """Set by the worker once the call ran, or was skipped as abandoned."""

    def deliver(self, result: outcome.Outcome[Any]) -> None:
        if not self.abandoned:
            trio.lowlevel.reschedule(self.task, result)


class IOThreads:
    def __init__(self, size: int, name: str = "metronome-io") -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._abandoned: list[_Call] = []
        """Calls given up on that may still be running (trio thread only)."""

    def _ensure_threads(self) -> None:
        if len(self._threads) < self._size:
            with self._lock:
                while len(self._threads) < self._size:
                    thread = threading.Thread(
                        target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:
                return
            if call.abandoned:
                call.ended.set()
                continue
            try:
                result = outcome.capture(call.fn)
            finally:
                call.ended.set()
            # If the trio run that asked is gone, nobody waits for this result.
            with contextlib.suppress(trio.RunFinishedError):
                call.token.run_sync_soon(call.deliver, result)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a worker thread and return (or raise) what it did."""
        self._ensure_threads()
        await trio.lowlevel.checkpoint_if_cancelled()
        call = _Call(fn, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
        self._queue.put(call)

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            call.abandoned = True
            self._abandoned = [c for c in self._abandoned if not c.ended.is_set()]
            self._abandoned.append(call)
            return trio.lowlevel.Abort.SUCCEEDED

        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    async def wait_abandoned(self, poll_s: float = 0.01) -> None:
        """Until every call abandoned so far has ended (cancellable; each is bounded by
        its socket timeout)."""
        while True:
            self._abandoned = [c for c in self._abandoned if not c.ended.is_set()]
            if not self._abandoned:
                return
            await trio.sleep(poll_s)

    def close(self) -> list[threading.Thread]:
        """Stop every thread once the calls queued before are done (non-blocking); return
        the threads, for a caller that wants to join them."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._queue.put(None)
        return threads
