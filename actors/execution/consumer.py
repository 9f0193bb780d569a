"""The consumer group actor of one task type: reads its stream, runs the handler, acks.

It wires four parts, each its own module, around one ``Flight`` (what this run holds):

1. reading (``reading``): XREADGROUP for as many messages as there are free slots, and the
   claimer's mailbox; ``begin_runs.lua`` drops a second message of a fire already started
   within the dedupe window (``duplicate_dropped``); a reclaimed message still runs;
2. running (``pool``, ``running``): each message's handler on one of the type's worker
   tasks, under its timeout, turned into an ``Outcome``;
3. completing (here, with the pure decision in ``completion``): outcomes flushed in
   batches, results-log lines written first, then retry contexts and task outcomes, then
   dead letters and ACKs (``Scripts.complete``);
4. leases (``leases``): every ``lease_s / 3`` the lease of every message this consumer
   holds is renewed (in flight, or waiting in its mailbox: ``ConsumerState.held``), so a
   live, busy consumer is never robbed; at the end everything unfinished is released.

Invariant: a message is acknowledged only after its handler finished and its outcome
(result line, retry context or DLQ entry) is written. A node killed at any point leaves
unacknowledged messages pending; the claimer of some node takes them over after the lease.

Graceful stop (``graceful=True``): stop reading, let running handlers finish within the
grace, flush, then hand back anything unfinished with an idle time past any lease so other
nodes reclaim it at once (``release.lua``), and leave the group if nothing is pending here.
"""

from __future__ import annotations

import functools

import attrs
import trio
import trio_util

from actors.execution import leases
from actors.execution.alone import Alone
from actors.execution.cancels import watch_cancels
from actors.execution.completion import Completion, RetryPolicy, decide
from actors.execution.completion_group import CompletionGroup
from actors.execution.flight import Flight
from actors.execution.handlers import Handler
from actors.execution.held_back import HeldBack
from actors.execution.identity import Identity, take_name
from actors.execution.pool import HandlerPool
from actors.execution.reading import Reader
from actors.execution.results_log import ResultsLog, append_waiting, result_line
from actors.execution.running import Runner
from actors.store.completion_writes import CompletionWrite
from actors.store.history import DEFAULT_HISTORY, Ledger
from actors.store.messages import Message
from actors.store.replies import Reclaimed
from actors.store.scripts import Scripts
from actors.store.streams import Streams
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.channels import Mailbox
from runtime.logging import emit_encoded, emit_events, get_logger

#: How long the flusher waits after the first completion for others to join its batch.
FLUSH_GATHER_S = 0.005
#: Most pending messages a starting consumer takes back from its earlier incarnation.
RECOVER_MAX = 10_000


#: What a consumer's setup gives it: its scripts, streams, name, and what it took back.
_SetUp = tuple[Scripts, Streams, Identity, list[Reclaimed]]


def _drain(inbox: Mailbox[Message], state: ConsumerState) -> None:
    state.held.clear()
    while True:
        try:
            inbox.receive.receive_nowait()
        except trio.WouldBlock:
            return


@attrs.frozen
class ConsumerSettings:
    """One type's consumer (built from ``[consumers.<type>]`` in ``actors.app``)."""

    concurrency: int = 10
    timeout_s: float = 60.0
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    lease_s: float = 30.0
    dedupe_window_s: float = 0.0
    block_ms: int = 500
    history: int = DEFAULT_HISTORY
    """Occurrences kept per task (``[scheduler] history``)."""
    late_ms: int = 60_000
    """A later start puts its task on the attention list (0 = never)."""
    max_deliveries: int = 5
    """Deliveries after which a message is poison: one an earlier incarnation of the name
    left pending that many times is not run again (``recover.lua``)."""


@attrs.define
class ConsumerState:
    """What the claimer of a type needs from its consumer. Owned by the consumer."""

    name: str | None = None
    """This node's consumer name in the group, once the consumer is running."""
    free: trio_util.AsyncValue[int] = attrs.field(factory=lambda: trio_util.AsyncValue(0))
    """Free handler slots right now."""
    pending_lock: trio.Lock = attrs.field(factory=trio.Lock)
    """Held while the consumer's pending entries change hands here: a recovery of the
    name's entries (its reply and the flight), the claimer's hand-over (its reply and
    ``held``), and a batch's completion (its ACKs and the flight). So none of them acts
    on a reply that another one has made stale (a message recovered that was just
    acknowledged, or handed over at the same moment)."""
    stopping: bool = False
    """Set once the consumer winds down (it reads no more, its mailbox included): the
    claimer takes nothing more over for it, which would only wait in the mailbox, one
    delivery more each, until released at the end."""
    held: dict[str, Message] = attrs.field(factory=dict)
    """Messages the claimer took over for the consumer, waiting in its mailbox (by id):
    pending under the consumer's name, so their leases are renewed with those in flight,
    and a recovery of the name's pending entries leaves them to the mailbox. The claimer
    adds them; the consumer's reader moves each into its flight as it starts it."""


class Consumer:
    def __init__(
        self,
        store: TaskStore,
        task_type: str,
        settings: ConsumerSettings,
        handler: Handler,
        results: ResultsLog,
        node: str,
        inbox: Mailbox[Message],
        state: ConsumerState,
        name: str | None = None,
        group: CompletionGroup | None = None,
        alone: Alone | None = None,
    ) -> None:
        self.store = store
        self.name = name or node
        """The stable name this consumer runs under when no live consumer holds it."""
        self.type = task_type
        self.settings = settings
        self.results = results
        self.node = node
        self.inbox = inbox
        self.state = state
        self.actor = f"node/consumers/{task_type}/consumer"
        self._log = get_logger(actor=self.actor)
        self.runner = Runner(handler, settings.timeout_s, settings.concurrency)
        self.ledger = Ledger(settings.history, 0, settings.late_ms)
        """The history's length, this node's number (once known) and the lateness bound."""
        self.group = group or CompletionGroup()
        """Writes this consumer's batches with those of the process's other consumers."""
        self.alone = alone or Alone()
        """The process's turn for its suspects (``actors.execution.alone``)."""
        self.held = HeldBack(self.actor, task_type, lambda task_id: 0)
        """The fires of this run held back (``actors.execution.held_back``)."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        # Started before its Redis setup, as every role is: Redis away, or a setup it
        # refuses (the type's stream key holding another kind of value, a permission
        # missing on it), is waited out by this type alone, while the node starts
        # everything after it (the other types, the API); a stop asked meanwhile ends
        # the wait. The claimer takes
        # nothing until the name is set below (not an earlier incarnation's: cleared here).
        self.state.name, self.state.free.value = None, 0
        self.actor = ctx.path
        self.results.prepare()
        task_status.started()
        setup: _SetUp | None = None
        async with trio_util.move_on_when(_stop_asked, ctx):
            setup = await self._set_up(ctx)
        if setup is None:  # stopping before Redis let it set up: nothing started here
            # (what a setup cut off took back stays pending, reclaimed after its lease)
            await ctx.wait_stop_requested()
            return
        scripts, streams, identity, recovered = setup
        name = identity.name
        lease_ms = int(self.settings.lease_s * 1000)
        flight = Flight()
        self.held = HeldBack(self.actor, self.type, scripts.keys.partition_of)
        lost: list[str] = []  # the holder of our name, once another consumer took it
        self.state.name, self.state.stopping = name, False
        self.state.free.value = self.settings.concurrency
        ctx.log.info(
            "consumer_ready", consumer=name, stream=scripts.keys.queue(self.type),
            recovered=len(recovered),
        )  # fmt: skip
        # Wind down on our stop request, or as soon as the whole node stops: supervisors
        # stop their children one at a time, and every type should stop reading at once.
        stopping = trio_util.AsyncBool(False)
        self.alone.add_pool(self.state.free, self.settings.concurrency)
        try:
            async with trio.open_nursery() as handlers, trio.open_nursery() as helpers:
                pool = HandlerPool(
                    self.runner, self.settings.concurrency, self.state.free, flight.finish,
                    handlers, self.actor,
                )  # fmt: skip
                reader = Reader(
                    scripts, streams, self.type, self.node, flight, self.state, pool.submit,
                    block_ms=self.settings.block_ms, actor=self.actor,
                    dedupe_window_ms=int(self.settings.dedupe_window_s * 1000),
                    lease_ms=lease_ms, alone=self.alone,
                )  # fmt: skip
                helpers.start_soon(pool.watch_timeouts)
                helpers.start_soon(
                    leases.renew_forever, scripts, self.type, identity, flight,
                    self.state.held, self.settings.lease_s, lost.append,
                )  # fmt: skip
                helpers.start_soon(self._flush_loop, scripts, flight)
                helpers.start_soon(
                    self.held.retry_forever, self.state.pending_lock, scripts, flight,
                    self._say_settled,
                )  # fmt: skip
                helpers.start_soon(watch_cancels, scripts, pool, self.type)
                helpers.start_soon(self._watch_stop, ctx, stopping, self.state)
                suspects = [e for e in recovered if e.alone]
                if suspects:
                    reader.expect_suspects()
                async with trio.open_nursery() as readers:
                    readers.start_soon(reader.run_alone, suspects, name, stopping)
                    readers.start_soon(reader.read_stream, name, stopping)
                    readers.start_soon(reader.read_inbox, self.inbox, stopping)
                    readers.start_soon(
                        reader.read_recovered, [e for e in recovered if not e.alone], stopping
                    )
                # Stopping: no more reads. Running handlers finish (the supervisor
                # cancels us when the grace is over); then the last flush. The idle
                # workers and the helpers are cancelled (handlers holds both).
                await self.state.free.wait_value(lambda free: free >= self.settings.concurrency)
                handlers.cancel_scope.cancel()
        except* leases.NameLost:
            pass  # said below, nothing released: exit, to be started under a name of our own
        finally:
            self.alone.forget_pool(self.state.free)
            self.state.name = None
            with ctx.cleanup():
                # The last flush gets half the cleanup's time: one Redis keeps refusing
                # (writes at maxmemory) is cut there, and what it held is handed back
                # below all the same (release.lua writes nothing Redis refuses then) to
                # run again elsewhere at once, not after a lease, counted as a delivery.
                with trio.move_on_after(ctx.cleanup_grace_s / 2) as flushing:
                    await self._flush(scripts, flight)
                    if self.held.queues:  # one last try; else handed back with the rest
                        async with self.state.pending_lock:
                            await self.held.try_all(scripts, flight, self._say_settled)
                if flushing.cancelled_caught:
                    ctx.log.warning(
                        "last_flush_cut", type=self.type, grace_s=ctx.cleanup_grace_s / 2,
                        fix="Redis refused or did not answer the outcomes of the fires that "
                        "ended last: they are handed back and run again",
                    )  # fmt: skip
                if lost:  # what is pending under the name is its new holder's too
                    ctx.log.error("consumer_name_lost", consumer=name, holder=lost[0])
                else:  # under the lock: no reclaim's reply lands on what it hands back
                    async with self.state.pending_lock:
                        await leases.release(
                            scripts, self.type, identity, flight, self.actor, ctx.log,
                            stopping=self.state.stopping,
                        )  # fmt: skip
            self.state.free.value = 0
        if lost:
            return
        # Drained because the node is stopping: wait for our turn (returning now would
        # read as an exit to restart).
        await ctx.wait_stop_requested()

    @staticmethod
    async def _watch_stop(
        ctx: ActorContext, stopping: trio_util.AsyncBool, state: ConsumerState
    ) -> None:
        await _stop_asked(ctx)
        stopping.value = state.stopping = True

    async def _set_up(self, ctx: ActorContext) -> _SetUp:
        """The type's group, this consumer's name and number, and what an earlier
        incarnation under the name left unfinished (taken back), each step riding out
        Redis."""
        redis = self.store.client
        await redis.ride_out(self.store.keys)
        scripts, streams = await self.store.scripts(), await self.store.streams()
        await redis.ride_out(lambda: streams.ensure_group(self.type))
        lease_ms = int(self.settings.lease_s * 1000)
        identity = await redis.ride_out(
            lambda: take_name(scripts, self.type, self.name, lease_ms, ctx.log)
        )
        number = await redis.ride_out(lambda: scripts.node_number(self.node))
        self.ledger = Ledger(self.settings.history, number, self.settings.late_ms)
        # What the claimer put in the mailbox was claimed for an earlier incarnation: under
        # our stable name it is recovered below with the rest, else it is released by the
        # incarnation that held it (or, its name lost, taken back by the name's new
        # holder). Either way it must not also run from the mailbox.
        _drain(self.inbox, self.state)
        recovered: list[Reclaimed] = []
        if identity.stable:
            recovered = await redis.ride_out(
                lambda: scripts.recover(
                    self.type,
                    identity.name,
                    RECOVER_MAX,
                    max_deliveries=self.settings.max_deliveries,
                )
            )
        return scripts, streams, identity, recovered

    # -- completing -------------------------------------------------------------------------

    async def _complete(self, scripts: Scripts, write: CompletionWrite) -> None:
        """One attempt at writing a batch's outcomes, shielded (see ``_flush``)."""
        with trio.CancelScope(shield=True):
            await self.group.complete(scripts, write)

    async def _flush_loop(self, scripts: Scripts, flight: Flight) -> None:
        while True:
            await flight.done_event.wait()
            # Handlers started together finish together: gather them into one batch.
            await trio.sleep(FLUSH_GATHER_S)
            flight.done_event = trio.Event()
            await self._flush(scripts, flight)

    async def _flush(self, scripts: Scripts, flight: Flight) -> None:
        """Write outcomes, then acknowledge (see the module's invariant).

        Each attempt at a batch runs under a shield: cancelled halfway, its finished
        messages would be released instead of acknowledged and run again elsewhere. Every
        attempt is Redis calls bounded by the socket timeout, so the shield cannot hang;
        the wait for Redis between attempts is not shielded. A batch is taken under the
        pending lock and stays the flight's ``unsettled`` one until it is settled: a flush
        cancelled before (the consumer stopping while a flush waits for the lock or for
        Redis) leaves it to the last flush, which goes on with it.
        """
        while flight.done or flight.unsettled is not None:
            async with self.state.pending_lock:
                if flight.unsettled is None:
                    batch = flight.take()
                    plan = decide(batch, self.settings.retry, self.node)
                    # Each line's fields encoded once: the log and results lines share them.
                    bodies = plan.bodies
                    # Repeated after a refusal or a cut, only the writes not done yet are
                    # sent again.
                    write = CompletionWrite(
                        self.type, retries=plan.retries, outcomes=plan.outcomes,
                        dead=plan.dead, acks=plan.acks, flights=plan.flights,
                        cancels_done=plan.cancels_done, ledger=self.ledger,
                    )  # fmt: skip
                    flight.unsettled = (batch, plan, write)
                    flight.unlogged = [
                        result_line(bodies[i], result) for i, result in enumerate(plan.results)
                    ]
                if flight.unlogged:  # written before the ACKs; a failing disk is waited out
                    await append_waiting(self.results, flight.unlogged, self._log)
                    flight.unlogged = []
                # Redis away: the batch waits (cancellably: cut at shutdown, its messages
                # stay pending and are reclaimed, never lost) and is written once Redis
                # answers; its fires in a partition Redis rejects are held back.
                await scripts.client.ride_out(
                    functools.partial(self._complete_apart, scripts, flight), self.actor
                )
                batch, plan, write = flight.unsettled
                flight.settled(batch)
                flight.unsettled = None
            self._say_settled(plan, write)

    def _say_settled(self, plan: Completion, write: CompletionWrite) -> None:
        """A settled batch's lines: ``finished`` (and the observers' summary), the other
        lifecycle lines, ``paused``."""
        summary = ("runs_finished", {"type": self.type, "durations_ms": plan.durations_ms})
        emit_encoded(self.actor, "finished", plan.bodies, summary, plan.finished_fields)
        emit_events(self.actor, plan.events)
        if write.paused:
            emit_events(self.actor, _paused_lines(write.paused, plan))

    async def _complete_apart(self, scripts: Scripts, flight: Flight) -> None:
        """One attempt at the unsettled batch (``actors.execution.held_back``): its fires
        in a held partition go behind the held ones, untried; those in a partition whose
        write Redis rejects are held back; the others are written at once. Past
        ``HELD_MAX`` fires held, the held ones are tried, then the rejection is raised (and
        waited on) without the batch's fires of a held partition being sent ahead."""
        held, say = self.held, self._say_settled
        tried = False  # the held ones, once a call: each try writes a partly failed one again
        while flight.unsettled is not None:
            if held.crowded(flight.unsettled):
                await held.try_all(scripts, flight, say)  # the pending lock is ours
                tried = True
                if crowded := held.crowded(flight.unsettled):
                    raise held.rejection(crowded)  # never ahead of the held: waited on
            behind = held.behind(flight.unsettled)
            if behind:
                flight.unsettled = held.hold(flight.unsettled, dict.fromkeys(behind), flight)
                if not flight.unsettled[0]:
                    return
            write = flight.unsettled[2]
            try:
                await self._complete(scripts, write)
                return
            except Exception:
                rejected, write.rejected = write.rejected, {}
                count = held.count_in(flight.unsettled, rejected)
                if not count:
                    raise
                if not held.room_for(count) and not tried:
                    await held.try_all(scripts, flight, say)
                    tried = True
                if not held.room_for(count):
                    raise
                flight.unsettled = held.hold(flight.unsettled, rejected, flight)
                if not flight.unsettled[0]:
                    return


def _paused_lines(
    paused: list[tuple[str, int]], plan: Completion
) -> list[tuple[str, dict[str, object]]]:
    """A ``paused`` line for each task its failures paused, with its last error."""
    errors = {e.task_id: e.error for e in plan.flights}
    return [
        ("paused", {"task_id": task_id, "reason": "failures", "failures": streak,
                    "error": errors.get(task_id, "")})
        for task_id, streak in paused
    ]  # fmt: skip


async def _stop_asked(ctx: ActorContext) -> None:
    """Until this actor is asked to stop, or the whole node begins to."""
    await trio_util.wait_any(
        ctx.wait_stop_requested, functools.partial(ctx.node_stopping.wait_value, True)
    )
