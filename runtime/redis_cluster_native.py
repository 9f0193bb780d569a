"""The fire path's calls on a Redis Cluster over the node's own sockets: each call sent to
the master of its keys' slot on a ``runtime.redis_native`` pool, on the trio thread.

Why: through redis-py a Cluster's calls cross to an I/O thread and back and run its
cluster pipeline's routing per command; at 10,000 fires/s on 3 masters that made a node
spend about twice the CPU a fire it spends on one Redis. The calls here are the ones
``runtime.redis_native`` carries for one server (pipelined scripts, the stream reads),
grouped by master: one pipeline a master. A connection to every master a call needs is
taken before anything is sent: a master whose connection is refused or closed (a killed
process) fails the call before any master ran a part of it, so a repeat sends each write
once (a redirected call is sent again after the others' parts ran: see below). Then every
pipeline is sent before any reply is read, so the masters work at once.
A master that fails once sent (silent, closed, ``LOADING``) leaves its part unknown, as any
connection lost mid-pipeline does. In ``RedisClient.scripts_in_order``'s first round the
other masters' replies are still read, so it tells its caller which of their writes ran,
and a caller that keeps that (a consumer's batch) repeats only the rest; any other call
fails at once, as on one server.

Routing: which master serves each of the 16,384 slots is copied from redis-py's cluster
client, which learned it with ``CLUSTER SLOTS`` (in the I/O thread); every master gets a
pool with the client's credentials and timeouts.

Changes of topology:

- ``MOVED`` (a slot now served by another master: a failover, a resharding) did not run
  the command. The slot's entry is updated from the reply and the call is sent again to
  the master it names, up to ``_REDIRECTS`` times (one still moved after those tries, the
  masters disagreeing on the slot's owner, is transient: the map is read again and the
  step repeated; never followed through redis-py, which follows ``ASK`` for scripts).
  ``ASK`` (a slot being migrated: the target takes its keys only behind ``ASKING``) is
  followed for a single command, its one key named (a read, sent
  behind ``ASKING`` here), never for a script: a script reads keys it builds from its
  partition's tag (a task's bucket hashes), which the target would serve behind
  ``ASKING`` as absent while they are still on the source, and act on (a due task whose
  state is not there yet would be taken off its schedule). A script answered ``ASK`` is
  sent again to its slot's master as for ``TRYAGAIN`` (below), and is transient past
  that: the step waits until the slot has moved (then ``MOVED``). On the source, a
  script that meets a key already moved fails with "non local key" before that command
  runs, which is transient too (``runtime.redis_replies``).
- A master unreachable (refused, reset, silent for the socket timeout) raises as on one
  server (the client reports ``RedisUnavailable``, actors wait and repeat their step). The
  map is then read again before the next call, and it is *stale*: the client's ``ping``,
  the probe ``ride_out`` waits on, learns it again and pings every master of it, and says
  Redis answers only once all of them did. So a step is repeated once every master it may
  need answers, not in a loop against a master that died before its replica took over.
- ``TRYAGAIN`` (a slot half-migrated: a call's keys split between two masters) did not
  run the call either: it is sent again alone after 50, 100 and 150 ms, the rest of the
  batch not sent again meanwhile. Past that, and for ``CLUSTERDOWN``, the reply is
  transient: the call fails, and ``ride_out`` repeats the whole step with the probe's
  backoff (PING still answers); a ``CLUSTERDOWN`` also has the map read again (a master
  cut off from the others answers it while its replica takes its slots over).

The order of calls on one master is the pipeline's; calls on different masters run in any
order relative to each other (as ``RedisClient.mixed_scripts`` says of every Cluster).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.crc
import redis.exceptions
import trio

from runtime.config import RedisSection
from runtime.redis_native import NativePool, pack, pipelined_on_each, pipelined_on_many
from runtime.redis_wire import (
    FAILED_MIDWAY,
    Reply,
    Script,
    evalsha_commands,
    is_outage,
    load_missing,
    stand_in,
    unknown_in_place,
)

#: How many times a call answered ``MOVED`` or ``TRYAGAIN`` is sent again on these pools.
_REDIRECTS = 3
#: Keys whose pool is remembered (cleared beyond: a fire's keys are a few per partition).
_KEY_CACHE = 4096
#: A probe reads the map again unless another read it this recently (many actors probe).
_PROBE_LEARNED_S = 0.25
#: Calls answered ``TRYAGAIN`` (a slot's keys split by a migration) are sent again after
#: this many seconds, times the round.
_TRYAGAIN_S = 0.05

Address = tuple[str, int]
Calls = Sequence[tuple[Script, Sequence[Any], Sequence[Any]]]


def read_topology(raw: Any, refresh: bool) -> tuple[Any, dict[int, Address]]:
    """In the I/O thread: redis-py's cluster client's map of slot → master (asking the
    cluster again first when ``refresh``), and one of its connection pools, whose
    credentials every master's pool takes."""
    nodes = raw.nodes_manager
    if refresh:
        try:
            nodes.initialize()
        except redis.exceptions.RedisClusterException as exc:
            # No node could be read, the slots are not all covered, the nodes disagree:
            # a cluster changing or away, waited for as an outage (as when the client is
            # built: ``RedisClient._raw``).
            raise redis.exceptions.ConnectionError(str(exc)) from exc
    slots: dict[int, Address] = {}
    template = None
    for slot, serving in list(nodes.slots_cache.items()):
        if serving:
            primary = serving[0]
            slots[slot] = (primary.host, int(primary.port))
            if template is None and primary.redis_connection is not None:
                template = primary.redis_connection.connection_pool
    if template is None:
        raise redis.exceptions.ConnectionError("the cluster has no master serving any slot")
    return template, slots


class ClusterRoutes:
    """Slot → master, and a ``NativePool`` to each master."""

    def __init__(self, settings: RedisSection) -> None:
        self._settings = settings
        self._template: Any = None
        self._slots: list[Address | None] = [None] * redis.crc.REDIS_CLUSTER_HASH_SLOTS
        self._pools: dict[Address, NativePool] = {}
        self._by_key: dict[str, NativePool] = {}
        self.unlearned = True
        """The map must be read (again) before a call is routed by it: none read yet, or
        a master failed since."""
        self.stale = False
        """A master failed: the outage probe (``ClusterCalls.ping``) learns the map again
        and pings every master of it before it says Redis answers."""
        self.failures = 0
        """Masters' failures so far: a map read, or a probe, that began before the last
        one clears neither flag."""
        self.learned = False
        self.learned_at = -1.0
        self.lock = trio.Lock()

    def failed(self) -> None:
        self.unlearned = self.stale = True
        self.failures += 1

    def adopt(self, template: Any, slots: dict[int, Address], failures: int) -> bool:
        """Take a map ``read_topology`` read, begun when ``failures`` had happened; False
        when its connections are not plain TCP (TLS): these pools cannot speak for
        them."""
        if NativePool.beside(template, self._settings) is None:
            return False
        self._template = template
        table: list[Address | None] = [None] * redis.crc.REDIS_CLUSTER_HASH_SLOTS
        for slot, address in slots.items():
            table[slot] = address
        self._slots, self._by_key = table, {}
        self.unlearned = self.unlearned and failures != self.failures
        self.learned, self.learned_at = True, trio.current_time()
        return True

    def off_the_map(self) -> list[NativePool]:
        """The pools of servers no longer in the map (their idle connections are closed;
        the pools stay, as calls in flight on them may still end there)."""
        serving = set(self._slots)
        return [p for a, p in self._pools.items() if a not in serving]

    def masters(self) -> list[NativePool]:
        return [self._pool(a) for a in sorted({a for a in self._slots if a is not None})]

    def pool_of(self, key: Any) -> NativePool:
        """The pool of the master serving ``key``'s slot."""
        pool = self._by_key.get(key)
        if pool is None:
            raw = key.encode() if isinstance(key, str) else bytes(key)
            address = self._slots[redis.crc.key_slot(raw)]
            if address is None:  # no master serves it (a cluster still forming)
                self.failed()
                raise redis.exceptions.ConnectionError(f"no master serves the slot of {key!r}")
            pool = self._pool(address)
            if len(self._by_key) >= _KEY_CACHE:
                self._by_key.clear()
            self._by_key[key] = pool
        return pool

    def moved(self, reply: redis.exceptions.AskError, answered: NativePool) -> NativePool:
        """A master said another one serves this slot (``MOVED``) or this key (``ASK``,
        not remembered): that one's pool. An empty host is the answering server's."""
        address = (reply.host or answered.host, int(reply.port))
        if isinstance(reply, redis.exceptions.MovedError):
            self._slots[reply.slot_id] = address
            self._by_key = {}
        return self._pool(address)

    def _pool(self, address: Address) -> NativePool:
        pool = self._pools.get(address)
        if pool is None:
            pool = NativePool.beside(self._template, self._settings, address)
            assert pool is not None  # adopt checked the template
            self._pools[address] = pool
        return pool

    def all_pools(self) -> list[NativePool]:
        """Every pool made (a master that left the map may still hold abandoned calls)."""
        return list(self._pools.values())


class ClusterCalls:
    """The Cluster half of ``RedisClient`` (its I/O threads, redis-py client, script calls
    through redis-py and reply classification are the client's)."""

    _routes: ClusterRoutes | None
    _threads: Any
    is_cluster: bool
    description: str

    @property
    def reads_parsed(self) -> bool:
        """Whether ``execute_unparsed`` replies are parsed after all (a Cluster's through
        redis-py: ``native_io`` off, or TLS)."""
        return self.is_cluster and self._routes is None

    @property
    def _raw(self) -> Any:
        raise NotImplementedError

    def _classified(self, replies: list[Reply], outages_in_place: bool = False) -> list[Reply]:
        raise NotImplementedError

    def _evalsha_loading(self, calls: Calls, outages_in_place: bool = False) -> list[Reply]:
        raise NotImplementedError

    async def _learn(self, routes: ClusterRoutes, *, probing: bool) -> ClusterRoutes | None:
        """``routes`` with a map read now if it must be (a probe reads it unless another
        did a moment ago); None when the cluster's connections are not plain TCP (the
        client then stays on redis-py)."""
        if routes.unlearned or (probing and _read_long_ago(routes)):
            async with routes.lock:
                if routes.unlearned or (probing and _read_long_ago(routes)):
                    refresh, failures = routes.learned, routes.failures
                    template, slots = await self._threads.run(
                        lambda: read_topology(self._raw, refresh)
                    )
                    if not routes.adopt(template, slots, failures):
                        self._routes = None
                        return None
                    for pool in routes.off_the_map():
                        await pool.close_idle()
        return routes

    async def _cluster_ping(self, routes: ClusterRoutes) -> bool:
        """The probe ``ride_out`` waits on after a master failed: the map learned again,
        then every master of it pinged on its pool; only then is the map no longer
        stale."""
        failures = routes.failures
        current = await self._learn(routes, probing=True)
        if current is None:
            return bool(await self._threads.run(lambda: self._raw.ping()))
        pings = [(pool, pack([("PING",)]), 1) for pool in current.masters()]
        await _on(current, pipelined_on_many(pings))
        if current.failures == failures:  # no master failed meanwhile
            current.stale = False
        return True

    async def _cluster_script_calls(
        self, routes: ClusterRoutes, calls: Calls, outages_in_place: bool = False
    ) -> list[Reply]:
        """``mixed_scripts`` on a Cluster: one pipeline a master, all sent before any
        reply is read; replies classified.

        ``outages_in_place`` (``_classified``): a master that fails once sent gives each of
        its calls a ``RedisUnavailable`` in place, as does one lost while a missing script
        is loaded or a redirected call sent again (one that refuses the load or the
        greeting gives them its refusal), and the other masters' replies are kept, so the
        caller knows which of their calls ran. Once an outage is in place, nothing
        more is redirected (``TRYAGAIN``, ``ASK``): the caller's step is repeated."""
        current = await self._learn(routes, probing=False)
        if current is None:
            answered = await self._threads.run(
                lambda: self._evalsha_loading(calls, outages_in_place)
            )
            return self._classified(answered, outages_in_place)
        replies: list[Reply] = [None] * len(calls)
        commands = evalsha_commands(calls)
        todo = list(range(len(calls)))
        moved_any = outage = False
        for round_ in range(_REDIRECTS + 1):
            groups: dict[NativePool, list[int]] = {}
            got: list[list[Reply] | Exception] = []
            failure: BaseException | None = None
            try:
                for i in todo:
                    keys = calls[i][1]
                    groups.setdefault(current.pool_of(keys[0] if keys else ""), []).append(i)
            except FAILED_MIDWAY as exc:  # a slot no master serves
                failure = exc
            if failure is None:
                jobs = [
                    (pool, pack([commands[i] for i in indices]), len(indices))
                    for pool, indices in groups.items()
                ]
                try:
                    got = await _on(current, pipelined_on_each(jobs, each=outages_in_place))
                except FAILED_MIDWAY as exc:  # a master not reached or greeted: none sent
                    failure = exc
            if failure is not None:
                if not outages_in_place:
                    raise failure
                unsent = stand_in(failure, self.description)
                for i in todo:
                    replies[i] = unsent
                outage = outage or self._is_outage(unsent)
                break
            if any(isinstance(answers, Exception) for answers in got):
                current.failed()
            moved: list[int] = []
            again: list[int] = []
            for (pool, indices), answers in zip(groups.items(), got, strict=True):
                if isinstance(answers, Exception):
                    for i in indices:  # unknown whether they ran
                        replies[i] = stand_in(answers, pool.address)
                    outage = True
                    continue
                sent = [calls[i] for i in indices]
                try:
                    answers = await _on(
                        current, load_missing(pool, sent, [commands[i] for i in indices], answers)
                    )
                except FAILED_MIDWAY as exc:
                    if not outages_in_place:
                        raise
                    # The calls still missing their script did not run, or are unknown.
                    answers = unknown_in_place(answers, exc, pool.address)
                    outage = outage or self._is_outage(stand_in(exc, pool.address))
                for i, reply in zip(indices, answers, strict=True):
                    replies[i] = reply
                    if isinstance(reply, redis.exceptions.MovedError):
                        current.moved(reply, pool)
                        moved.append(i)
                    elif isinstance(reply, redis.exceptions.TryAgainError) or _asked(reply):
                        again.append(i)  # did not run: sent again alone, the rest kept
            todo = moved + again
            moved_any = moved_any or bool(moved)
            if not todo or outage or round_ == _REDIRECTS:
                break
            if again:
                await trio.sleep(_TRYAGAIN_S * (round_ + 1))
        if moved_any:  # a master that lost its last slot keeps no idle connection
            for pool in current.off_the_map():
                await pool.close_idle()
        relearn = False
        for i, r in enumerate(replies):
            if _asked(r):  # a slot still migrating: never followed (module docstring)
                replies[i] = redis.exceptions.TryAgainError(
                    f"TRYAGAIN a script's slot is being migrated ({r}): sent again once it "
                    "has moved"
                )
            elif isinstance(r, redis.exceptions.MovedError):
                # MOVED again and again (the masters disagree on the slot's owner), or left
                # beside an outage: it did not run. Not followed through redis-py, which
                # follows ASK for scripts too, nor handed on as a rejection: the step waits
                # and is repeated with the map read again.
                replies[i] = redis.exceptions.TryAgainError(
                    f"TRYAGAIN a script's slot is moving ({r}): sent again once the masters "
                    "agree on its owner"
                )
                relearn = True
            elif isinstance(r, redis.exceptions.ClusterDownError):
                relearn = True  # a master cut off from the others: the map is read again
        if relearn:
            current.failed()
        return self._classified(replies, outages_in_place)

    def _is_outage(self, reply: Reply) -> bool:
        """Whether a reply in place is an outage once classified (a transient error reply
        is one too)."""
        return is_outage(self._classified([reply], outages_in_place=True)[0])

    async def _cluster_one(self, routes: ClusterRoutes, key: Any, command: Sequence[Any]) -> Reply:
        """One command on the master of ``key``'s slot, its reply unparsed; an error reply
        raised. ``MOVED`` is followed as for scripts, ``ASK`` with ``ASKING`` before the
        command on the server it names; redirected past ``_REDIRECTS``, it is an outage
        (the caller's step is repeated once the slot has settled)."""
        current = await self._learn(routes, probing=False)
        if current is None:
            return await self._threads.run(lambda: self._raw.execute_command(*command))
        pool = current.pool_of(key)
        asking = False
        for _ in range(_REDIRECTS + 1):
            try:
                if not asking:
                    return await _on(current, pool.one(command))
                (asked, reply) = await _on(current, pool.pipelined(pack([("ASKING",), command]), 2))
                for answer in (asked, reply):  # ASKING refused (an ACL without it): said
                    if isinstance(answer, redis.exceptions.ResponseError):
                        raise answer
                return reply
            except redis.exceptions.AskError as exc:  # MOVED too (a subclass)
                pool = current.moved(exc, pool)
                asking = not isinstance(exc, redis.exceptions.MovedError)
            except redis.exceptions.ClusterDownError:
                current.failed()  # a master cut off from the others: the map is read again
                raise
        raise redis.exceptions.ConnectionError(f"the slot of {key!r} was redirected too often")

    async def _cluster_wait_abandoned(self, routes: ClusterRoutes) -> bool:
        settled = True
        for pool in routes.all_pools():
            settled = await pool.wait_abandoned() and settled
        return settled

    async def _cluster_close(self, routes: ClusterRoutes) -> None:
        for pool in routes.all_pools():
            await pool.aclose()


def _asked(reply: Reply) -> bool:
    """Whether ``reply`` is ``ASK`` (a key of a slot being migrated), not ``MOVED``."""
    return isinstance(reply, redis.exceptions.AskError) and not isinstance(
        reply, redis.exceptions.MovedError
    )


def _read_long_ago(routes: ClusterRoutes) -> bool:
    return trio.current_time() - routes.learned_at >= _PROBE_LEARNED_S


async def _on(routes: ClusterRoutes, call: Any) -> Any:
    """``await call``; a master that cannot be reached makes the map unlearned and
    stale."""
    try:
        return await call
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        routes.failed()
        raise
