"""``python -m bench chaos SCENARIO``: real faults under real node processes; what was lost.

Starts its own Redis (AOF on, ``appendfsync everysec``: it must be able to kill and restart
it), registers N periodic tasks phased over the interval, starts ``--nodes`` node
processes whose handler writes each start to a local file (never to the Redis under
test), injects the scenario's fault, and prints one JSON line:

- ``expected``: fires due in the window [t0 + interval, t0 + duration - interval];
  ``executed``: of those, how many started; ``missed``: due, never started;
- ``duplicates``: the same attempt of a fire started twice, split into
  ``duplicates_explained`` (due within a fault's reach: in flight when it struck) and
  ``duplicates_unexplained`` (anything else: a bug);
- ``lag_p50_ms`` / ``lag_p99_ms`` / ``lag_max_ms``: start minus due time;
- ``first_fresh_fire_s``: from the fault's end (Redis answering again, the pause over, the
  last node restarted) to the first start of a fire due after it; ``ran_during_faults``:
  fires due while a fault lasted that started before it ended;
- ``node_exits``: node processes that exited on their own (a kill of ours is not one);
- ``reclaimed``, ``actor_crashes``, ``redis_refused``, ``retry_unreadable``,
  ``poison_held``: those lines in the nodes' logs
  (messages taken over from another consumer; actors that crashed; refusal runs begun);
- ``tasks_before`` / ``tasks_after``: tasks stored before the run and after it.

Scenarios: ``redis-restart`` (SIGKILL Redis, start it again from its AOF ``--fault-s``
later), ``redis-stall`` (``CLIENT PAUSE`` for ``--fault-s``), ``sentinel-failover`` (a
primary, a replica and three sentinels, the nodes knowing only the sentinels; SIGKILL the
primary: the fault ends when the replica is promoted), ``cluster-failover`` (three
primaries with a replica each, the nodes in cluster mode; every primary in turn hands
over to its replica with no write lost: its writes paused, the replica caught up and
promoted with ``CLUSTER FAILOVER TAKEOVER``, as a manual ``CLUSTER FAILOVER`` does without
the primaries' vote), ``cluster-kill`` (the same cluster; SIGKILL a primary, and
``--fault-s`` later promote its replica with ``CLUSTER FAILOVER TAKEOVER``: a primary lost
with whatever it had not yet sent its replica), ``cluster-reshard`` (three primaries;
every slot holding the namespace's keys moved to the next primary, ten keys at a time,
over about ``--fault-s``: partitions split between two primaries meanwhile),
``endpoint-failover`` (a primary and its replica behind one address, a proxy standing for
a managed endpoint's DNS name: the replica promoted with no write lost, the old primary
made its replica, answering ``READONLY`` on the connections the nodes hold, and the
address pointed at the new primary: ``bench.chaos_endpoint``),
``kill-nodes`` (SIGKILL a
random node every ``--every-s``, restart it 3 s later), ``kill-children`` (SIGKILL a random
child process of a node run with ``[processes]``, every ``--every-s``), ``stall-nodes``
(SIGSTOP a random node every ``--every-s`` for ``--fault-s``, then SIGCONT: frozen past its
5 s leases, its partitions and messages are taken over, and it wakes to find them gone),
``flaky`` (one fire
in ten fails its first attempt; its retry must run), ``redis-busy`` (a Lua busy loop of
``--fault-s`` with ``busy-reply-threshold`` 100 ms: Redis answers ``BUSY``), ``redis-oom``
(``maxmemory`` 1 with ``noeviction`` for ``--fault-s``: every write refused with ``OOM``
while the flaky handler's failed first attempts need their retries written),
``long-handler`` (handlers of ``--hold-s`` seconds, ``lease_s`` 6, a ``CLIENT PAUSE`` of
``--fault-s`` longer than the lease: the live, busy consumers must keep their messages),
``poison-kill`` (one fire whose handler kills its consumer process, a child of node 0,
every time it runs, ``max_deliveries`` 3: it alone must go to the dead letters, while the
fires read with it run: ``dead_letters``, ``dead_letters_not_the_killer``, and the
consumer's deaths in ``actor_crashes``; a killed fire counts as executed, having started),
``stream-rejected`` (the tasks spread over two types, the second's stream moved aside and
a string put in its place for ``--fault-s``, then put back: every call on it rejected,
``WRONGTYPE``; the first type must go on firing meanwhile: ``ran_during_faults``; its
renewals and acknowledgements wait too, so a fault as long as the 5 s message lease may
have a message taken over, ``reclaimed``, and run again), ``partition-rejected`` (the
schedule of one partition of the namespace's 16 moved aside and a string put in its place
for ``--fault-s``, then put back: its claims rejected, ``WRONGTYPE``; the other partitions
must go on firing meanwhile, ``ran_during_faults``, and its fires once it is back: 0
missed), ``outcomes-rejected`` (likewise one partition's history, which in this run, with
no misfires and no overlap policies, only the consumers write: that partition's outcome
writes rejected; its fires run and are held back,
pending, while every other partition's complete, ``ran_during_faults``, and are completed
once it is back, none run twice), ``dlq-rejected`` (likewise the type's dead-letter stream,
while every fire of two tasks fails, ``max_attempts`` 1: their dead letters rejected; the
partitions of those two tasks are held back, pending, and every other partition's fires
complete, ``pending_at_fault_end`` (the held ones and those in flight, not every fire of
the fault), then each dead letter is written once it is back, ``dead_letters`` =
``dead_letters_expected``), ``results-log-failing`` (every node's results log moved
aside and a directory put at its path for ``--fault-s``, then removed: each write fails,
as on a full disk; the batches wait for their lines, their messages renewed, and run none
twice), ``retry-unreadable`` (``flaky``'s failures, and retry contexts no version wrote put
in every partition's retry index, due at once, for ``--fault-s``, then deleted: one without
its task id, one whose attempt is no number, one without its payload; the dispatcher names
each, ``retry_unreadable``, keeps it, ``unreadable_kept`` of ``unreadable_planted``, and
dispatches every real retry meanwhile), ``poison-ends-rejected`` (``poison-kill`` with a
string put at every consumer's poison-ends key as it joins the group, until a claimer has
held the killer back for it, ``poison_held``, and ``--fault-s`` more: the fires read with
the killer are taken over and run meanwhile, and the killer is dead-lettered once the keys
are gone).
The Redis-refusal and rejection scenarios involve no kill: any duplicate is a bug there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
import redis.cluster
import trio

from bench import chaos_endpoint, chaos_faults, chaos_figures
from bench.common import child_pids
from bench.fire import NAMESPACE, _analyse, _register, start_nodes, stop_nodes
from runtime.embedded_redis import find_server_binary
from runtime.testing.local_redis import LocalCluster, LocalSentinel, RedisProcess

SCENARIOS = (
    "redis-restart", "redis-stall", "sentinel-failover", "cluster-failover", "cluster-kill",
    "kill-nodes", "kill-children", "stall-nodes", "flaky", "redis-busy", "redis-oom",
    "long-handler", "poison-kill", "stream-rejected", "partition-rejected",
    "outcomes-rejected", "dlq-rejected", "results-log-failing", "retry-unreadable",
    "poison-ends-rejected", "cluster-reshard", "endpoint-failover",
)  # fmt: skip
#: Scenarios whose handler fails one fire in ten on its first attempt (retries counted).
FLAKY = ("flaky", "redis-oom", "retry-unreadable")
#: Scenarios with one fire whose handler kills its consumer process every time it runs.
KILLERS = ("poison-kill", "poison-ends-rejected")


def run(
    scenario: str, n: int, interval_s: float, duration_s: float, nodes: int, fault_s: float,
    every_s: float, concurrency: int = 200, hold_s: float = 15.0,
) -> dict[str, Any]:  # fmt: skip
    if scenario not in SCENARIOS:
        raise SystemExit(f"chaos: unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    if duration_s < 4 * interval_s + 20:
        raise SystemExit("chaos: --duration-s must leave room: at least 4 intervals + 20 s")
    sentinel: LocalSentinel | None = None
    cluster: LocalCluster | None = None
    pair: tuple[RedisProcess, RedisProcess, chaos_endpoint.SwitchingProxy] | None = None
    aof = ["--appendonly", "yes", "--appendfsync", "everysec"]
    if scenario == "endpoint-failover":
        server, replica = chaos_endpoint.start_pair(find_server_binary(), aof)
        pair = (server, replica, chaos_endpoint.SwitchingProxy(server.port))
        url = pair[2].url
    elif scenario == "sentinel-failover":
        sentinel = LocalSentinel(find_server_binary()).start()
        server, url = sentinel.primary, sentinel.url
    elif scenario in ("cluster-failover", "cluster-kill", "cluster-reshard"):
        cluster = LocalCluster(find_server_binary(), replicas=scenario != "cluster-reshard")
        cluster.start()
        server, url = cluster.nodes[0], cluster.url
    else:
        server = RedisProcess(find_server_binary(), aof).start()
        url = server.url
    workdir = Path(server.dir) / "bench"
    workdir.mkdir()
    try:
        # fire_all: every grid time must run, also those due while Redis was away, so that
        # "missed" counts losses, not fires a coalesce policy merged on purpose.
        # stream-rejected: two types, the second's stream broken for fault_s
        types = 2 if scenario == "stream-rejected" else 1
        t0_ms, _ = trio.run(
            _register, url, n, interval_s, "fire_all", cluster is not None, None, "allow_all",
            types,
        )  # fmt: skip
        before = chaos_figures.count_tasks(
            url if cluster is not None else server.url, cluster is not None
        )
        options: dict[str, Any] = {
            "handler": "bench.handlers:record_flushed", "lease_s": 5.0,
            "cluster": cluster is not None,
        }  # fmt: skip
        if scenario in FLAKY:
            options = {"handler": "bench.handlers:record_flaky", "backoff_base_s": 0.2}
        if scenario == "long-handler":  # every fire runs hold_s: room for all of them
            options = {"handler": "bench.handlers:record_long", "lease_s": 6.0}
            os.environ["METRONOME_BENCH_HOLD_S"] = str(hold_s)
            concurrency = max(concurrency, int(n / interval_s * (hold_s + 5) / nodes) + 50)
        if scenario == "kill-children":
            options["processes"] = 1
        if scenario == "dlq-rejected":  # two tasks' fires all dead letters
            options |= {"handler": "bench.handlers:record_doomed",
                        "settings": ("consumers.bench.max_attempts=1",)}  # fmt: skip
        if types > 1:
            options["types"] = types
        killer_s = t0_ms / 1000 + interval_s + 2  # KILLERS: when its fire is due
        if scenario in KILLERS:
            options |= {"handler": "bench.handlers:record_or_die", "processes": 1,
                        "settings": ("consumers.bench.max_deliveries=3",)}  # fmt: skip
            due_from, due_to = int(killer_s * 1000), int((killer_s + interval_s) * 1000)
            os.environ["METRONOME_BENCH_KILLER"] = f"b0:{due_from}:{due_to}"
        procs = start_nodes(workdir, url, nodes, concurrency, "info", **options)
        faults: list[tuple[float, float]] = []  # (start, end), wall-clock seconds
        exits = 0
        planted: dict[str, Any] = {}  # retry-unreadable: what it planted, what was kept
        try:
            _sleep_until(t0_ms / 1000 + interval_s + 2)
            if sentinel is not None:
                faults, exits = [chaos_faults.fail_over(sentinel)], 0
            elif pair is not None:
                faults = [chaos_endpoint.fail_over(pair[2], pair[0], pair[1])]
            elif cluster is not None:
                start = time.time()
                if scenario == "cluster-kill":
                    cluster.nodes[1].kill()  # not the one the nodes' URL names
                    time.sleep(fault_s)
                    cluster.take_over(1)
                elif scenario == "cluster-reshard":
                    start, _ = chaos_faults.reshard(cluster, fault_s)
                else:
                    for index in range(len(cluster.nodes)):  # every shard changes hands
                        cluster.fail_over(index)
                faults, exits = [(start, time.time())], 0
            elif scenario == "poison-kill":  # b0's one fire due in the interval from killer_s
                faults = [(killer_s, killer_s + interval_s)]
            elif scenario == "poison-ends-rejected":  # ... and its dead letter held back
                _sleep_until(killer_s)
                faults = [chaos_faults.reject_poison_ends(url, workdir, fault_s)]
            elif scenario == "retry-unreadable":
                planted = chaos_faults.unreadable_retries(server, n, fault_s)
                faults = [planted.pop("fault")]
            else:
                faults, exits = _inject(
                    scenario, server, procs, workdir, fault_s, every_s, concurrency, options,
                    end_s=t0_ms / 1000 + duration_s - interval_s - 15,
                )  # fmt: skip
            # The fires owed at a failover's end get 15 s to start, however late it ended
            # (a loaded machine); the other faults end 15 s before the run does.
            failovers = faults if sentinel or cluster or pair else []
            _sleep_until(max([t0_ms / 1000 + duration_s] + [end + 15 for _, end in failovers]))
            if scenario in KILLERS:
                _wait_for_dead_letter(url)
            exits += sum(1 for p in procs if p.poll() is not None)
        finally:
            stop_nodes(procs)
        figures = _analyse(workdir, n, interval_s, duration_s, t0_ms, scenario in FLAKY)
        extra = chaos_figures.fault_figures(workdir, faults) | planted
        if scenario == "dlq-rejected":  # every doomed fire's dead letter, each once
            with redis.Redis.from_url(url) as client:
                dead = client.xrange(f"{{{NAMESPACE}:q:bench}}:dlq")
            extra["dead_letters"] = len(dead)
            extra["dead_letters_expected"] = chaos_figures.doomed_fires(workdir)
            noted = workdir / "pending_at_fault_end"
            extra["pending_at_fault_end"] = int(noted.read_text()) if noted.exists() else None
        if scenario in KILLERS:  # the killer's dead letter, and any other's
            with redis.Redis.from_url(url) as client:
                dead = client.xrange(f"{{{NAMESPACE}:q:bench}}:dlq")
            extra["dead_letters"] = len(dead)
            extra["dead_letters_not_the_killer"] = sum(
                1 for _, f in dead if (f[b"task_id"], f[b"reason"]) != (b"b0", b"poison")
            )
        after = chaos_figures.count_tasks(
            sentinel.replica.url if sentinel is not None else url, cluster is not None
        )
    finally:
        if sentinel is not None:
            sentinel.remove()
        elif cluster is not None:
            cluster.remove()
        else:
            server.remove()
        if pair is not None:
            pair[2].close()
            pair[1].remove()
    return {
        "scenario": scenario, "n": n, "interval_s": interval_s, "duration_s": duration_s,
        "nodes": nodes, "fault_s": fault_s, "faults": len(faults), **figures, **extra,
        "node_exits": exits, "tasks_before": before, "tasks_after": after,
    }  # fmt: skip


def _inject(
    scenario: str, server: RedisProcess, procs: list[subprocess.Popen[bytes]], workdir: Path,
    fault_s: float, every_s: float, concurrency: int, options: dict[str, Any], end_s: float,
) -> tuple[list[tuple[float, float]], int]:  # fmt: skip
    """Strike; return the faults as (start, end) and node exits seen on the way."""
    if scenario == "redis-restart":
        start = time.time()
        server.kill()
        time.sleep(fault_s)
        server.start(server.port)  # from its AOF, on the same port; returns once it answers
        return [(start, time.time())], 0
    if scenario in ("redis-stall", "long-handler"):
        client = redis.Redis.from_url(server.url)
        start = time.time()
        client.client_pause(int(fault_s * 1000), all=True)
        client.close()
        time.sleep(fault_s)
        return [(start, start + fault_s)], 0
    if scenario == "redis-busy":
        return [chaos_faults.busy(server, fault_s)], 0
    if scenario == "stream-rejected":  # a key of another kind where a stream should be
        return [chaos_faults.reject_key(server, f"{{{NAMESPACE}:q:bench1}}:queue", fault_s)], 0
    if scenario == "partition-rejected":  # ... where a partition's schedule should be
        return [chaos_faults.reject_key(server, f"{{{NAMESPACE}:3}}:schedule", fault_s)], 0
    if scenario == "outcomes-rejected":  # ... where its history (the consumers' here) should be
        return [chaos_faults.reject_key(server, f"{{{NAMESPACE}:3}}:history", fault_s)], 0
    if scenario == "dlq-rejected":  # ... where the type's dead letters should be
        dlq = f"{{{NAMESPACE}:q:bench}}:dlq"
        note = chaos_faults.pending_at_end(server, workdir)
        return [chaos_faults.reject_key(server, dlq, fault_s, note)], 0
    if scenario == "results-log-failing":
        return [chaos_faults.fail_results_logs(workdir, len(procs), fault_s)], 0
    if scenario == "redis-oom":
        client = redis.Redis.from_url(server.url)
        start = time.time()
        client.config_set("maxmemory", "1")
        time.sleep(fault_s)
        client.config_set("maxmemory", "0")
        client.close()
        return [(start, time.time())], 0
    faults: list[tuple[float, float]] = []
    exits = 0
    while time.time() + every_s + (fault_s if scenario == "stall-nodes" else 0) < end_s:
        time.sleep(every_s)
        if scenario == "kill-children":
            children = child_pids(procs[0].pid)
            if children:
                start = time.time()
                chaos_faults.kill(random.choice(children))
                faults.append((start, start))
        elif scenario == "kill-nodes":
            i = random.randrange(len(procs))
            exits += procs[i].poll() is not None
            start = time.time()
            procs[i].send_signal(signal.SIGKILL)
            procs[i].wait()
            time.sleep(3)
            (procs[i],) = start_nodes(
                workdir, server.url, 1, concurrency, "info", first=i, **options
            )
            faults.append((start, time.time()))
        elif scenario == "stall-nodes":  # frozen (a VM paused, a stop-the-world pause)
            i = random.randrange(len(procs))
            start = time.time()
            procs[i].send_signal(signal.SIGSTOP)
            try:
                time.sleep(fault_s)
            finally:  # even on Ctrl-C: a stopped node would not stop
                procs[i].send_signal(signal.SIGCONT)
            faults.append((start, time.time()))
    return faults, exits


def _sleep_until(when_s: float) -> None:
    time.sleep(max(0.0, when_s - time.time()))


#: How long ``poison-kill`` waits past its run for the killer's dead letter.
DEAD_LETTER_WAIT_S = 90.0


def _wait_for_dead_letter(url: str) -> None:
    """Until the type's dead-letter stream has an entry, at most ``DEAD_LETTER_WAIT_S``:
    the killer's three deliveries each wait for its consumer's restart and a lease, which a
    loaded machine (several scenarios at once on two cores) can stretch past the run."""
    deadline = time.time() + DEAD_LETTER_WAIT_S
    with redis.Redis.from_url(url) as client:
        while time.time() < deadline and not client.xlen(f"{{{NAMESPACE}:q:bench}}:dlq"):
            time.sleep(0.2)
