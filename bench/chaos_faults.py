"""The faults ``bench chaos`` strikes with that are more than a signal: a key of another
kind put where one of the namespace's should be, a results log made unwritable, a Lua busy
loop, a Sentinel failover, a Cluster resharded under the nodes, records no version of
Metronome wrote (a retry context it cannot run, a poison-ends key of another kind). Each
returns the fault's (start, end) in wall-clock seconds."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import redis
import redis.crc

from actors.store.keys import GROUP, Keys
from bench.fire import NAMESPACE
from runtime.testing.local_redis import LocalCluster, LocalSentinel, RedisProcess


def reject_key(
    server: RedisProcess, key: str, fault_s: float, before_end: Any = None
) -> tuple[float, float]:
    """``key`` (a stream, a schedule, a history) moved aside, if there, and a string put in
    its place for ``fault_s`` (every call on it rejected: WRONGTYPE), then put back as it
    was; ``before_end`` (a callable) is called just before."""
    client = redis.Redis.from_url(server.url)
    aside = f"{key}:aside"
    start = time.time()
    client.eval(
        "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end "
        "redis.call('SET', KEYS[1], 'not a key')",
        2, key, aside,
    )  # fmt: skip
    time.sleep(fault_s)
    if before_end is not None:
        before_end()
    client.eval(
        "redis.call('DEL', KEYS[1]) "
        "if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('RENAME', KEYS[2], KEYS[1]) end",
        2, key, aside,
    )  # fmt: skip
    client.close()
    return start, time.time()


def fail_results_logs(workdir: Path, nodes: int, fault_s: float) -> tuple[float, float]:
    """Each node's results log moved aside and a directory put at its path for
    ``fault_s`` (every write fails, as on a full disk), then the directory removed."""
    paths = [workdir / f"results-{i}.jsonl" for i in range(nodes)]
    start = time.time()
    for path in paths:
        for attempt in itertools.count():
            with contextlib.suppress(FileNotFoundError):
                path.rename(path.with_name(f"{path.name}.aside{attempt}"))
            try:
                path.mkdir()
                break
            except FileExistsError:  # a node's write made the file again meanwhile
                continue
    time.sleep(fault_s)
    for path in paths:
        path.rmdir()
    return start, time.time()


def busy(server: RedisProcess, fault_s: float) -> tuple[float, float]:
    """A script that loops ``fault_s`` seconds on Redis's clock: past 100 ms every other
    client is answered ``BUSY`` until it returns."""
    client = redis.Redis.from_url(server.url, socket_timeout=fault_s + 30)
    client.config_set("busy-reply-threshold", "100")
    loop = (
        "local t0 = redis.call('TIME') local s = tonumber(ARGV[1]) "
        "while true do local t = redis.call('TIME') "
        "if (t[1] - t0[1]) + (t[2] - t0[2]) / 1e6 > s then return 1 end end"
    )
    start = time.time()
    client.eval(loop, 0, fault_s)
    client.close()
    return start, time.time()


def fail_over(sentinel: LocalSentinel) -> tuple[float, float]:
    """SIGKILL the primary; the fault ends when the sentinels name the replica primary."""
    start = time.time()
    sentinel.primary.kill()
    deadline = start + 60
    while sentinel.master_port() != sentinel.replica.port:
        if time.time() > deadline:
            raise SystemExit("chaos: the sentinels promoted no replica within 60 s")
        time.sleep(0.1)
    return start, time.time()


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def pending_at_end(server: RedisProcess, workdir: Path) -> Any:
    """What ``dlq-rejected`` notes in the workdir as its fault ends: how many messages of
    the type are pending (run or running, not acknowledged): with the dead fires'
    partitions held back, theirs and those in flight, not every fire of the fault."""

    def note() -> None:
        with redis.Redis.from_url(server.url) as client:
            summary: Any = client.xpending(f"{{{NAMESPACE}:q:bench}}:queue", GROUP)
        (workdir / "pending_at_fault_end").write_text(str(summary["pending"]))

    return note


#: What ``retry-unreadable`` plants in each partition's retry index: retry contexts a hand
#: edit or another program may leave (no task id; no whole attempt; no payload). The last
#: two name a real task of the partition (a context of a task that is gone is dropped).
UNREADABLE: tuple[dict[str, str], ...] = (
    {"type": "bench", "payload": "null", "attempt": "1", "due_ms": "1"},
    {"type": "bench", "payload": "null", "attempt": "soon", "due_ms": "1"},
    {"type": "bench", "attempt": "1", "due_ms": "1"},
)


def unreadable_retries(server: RedisProcess, n: int, fault_s: float) -> dict[str, Any]:
    """``UNREADABLE`` put in every partition's retry index, due at once, for ``fault_s``,
    then deleted (as an operator would): the dispatcher must name them
    (``retry_unreadable``), leave them as they are, and go on dispatching the real
    retries. Returns the fault, how many contexts it planted and how many it found kept
    at its end."""
    with redis.Redis.from_url(server.url) as client:
        keys = Keys(NAMESPACE, int(client.hget(f"{NAMESPACE}:meta", "partitions") or 0))
        owners: dict[int, str] = {}
        for task_id in (f"b{i}" for i in range(n)):
            owners.setdefault(keys.partition_of(task_id), task_id)
        planted: list[tuple[str, str, str]] = []  # (retry index, schedule id, context)
        start = time.time()
        for partition, task_id in owners.items():
            for kind, fields in enumerate(UNREADABLE):
                schedule_id = f"{task_id}:{kind}"
                context = keys.retry_context_prefix(partition) + schedule_id
                client.hset(context, mapping={**fields, "task_id": task_id} if kind else fields)
                client.zadd(keys.retry(partition), {schedule_id: 0})
                planted.append((keys.retry(partition), schedule_id, context))
        time.sleep(fault_s)
        kept = sum(
            client.exists(context) == 1 and client.zscore(index, schedule_id) is not None
            for index, schedule_id, context in planted
        )
        for index, schedule_id, context in planted:
            client.delete(context)
            client.zrem(index, schedule_id)
    return {"fault": (start, time.time()), "unreadable_planted": len(planted),
            "unreadable_kept": kept}  # fmt: skip


#: Most seconds ``poison-ends-rejected`` waits for a claimer to hold its poison back.
POISON_HELD_WAIT_S = 60.0


def reject_poison_ends(url: str, workdir: Path, fault_s: float) -> tuple[float, float]:
    """A string put at the poison-ends key of every consumer of the type's group as it
    joins (``Keys.poison_ends``: where a claimer notes the poison it dead-letters), until a
    claimer has held its poison back for that (``poison_held`` in a node's log) and
    ``fault_s`` more, then removed: the claimers must go on taking the other messages over
    meanwhile, and dead-letter the poison once the keys are back."""
    keys = Keys(NAMESPACE, 1)
    planted: set[str] = set()
    held_at: float | None = None
    checks = 0
    start = time.time()
    with redis.Redis.from_url(url) as client:
        while time.time() < (held_at + fault_s if held_at else start + POISON_HELD_WAIT_S):
            with contextlib.suppress(redis.ResponseError):  # the group not there yet
                for consumer in client.xinfo_consumers(keys.queue("bench"), GROUP):
                    key = keys.poison_ends("bench", consumer["name"].decode())
                    if key not in planted and client.set(key, "not a key", nx=True):
                        planted.add(key)
            checks += 1
            if (
                held_at is None
                and checks % 10 == 0
                and any(
                    '"event":"poison_held"' in p.read_text(errors="replace")
                    for p in workdir.glob("node-*.log")
                )
            ):
                held_at = time.time()
            time.sleep(0.05)
        for key in planted:
            if client.type(key) == b"string":
                client.delete(key)
    return start, time.time()


def reshard(cluster: LocalCluster, fault_s: float) -> tuple[float, float]:
    """Every slot that holds the namespace's keys moved to the next primary while the
    nodes fire, the way ``redis-cli --cluster reshard`` moves them: the slot marked
    importing and migrating, its keys migrated ten at a time (a partition's keys split
    between two primaries meanwhile: scripts answered ``ASK``, or meeting a key already
    moved), then given to its new primary; the moves spread over about ``fault_s``."""
    primaries: list[Any] = [redis.Redis(port=n.port, socket_timeout=10) for n in cluster.nodes]
    ids = [p.execute_command("CLUSTER", "MYID") for p in primaries]
    slots: list[tuple[int, int]] = []  # (slot, index of its primary)
    for index, primary in enumerate(primaries):
        found = {
            redis.crc.key_slot(key) for key in primary.scan_iter(match=f"*{NAMESPACE}*", count=1000)
        }
        slots += [(slot, index) for slot in sorted(found)]
    start = time.time()
    pause_s = fault_s / max(1, len(slots)) / 4
    for slot, index in slots:
        source, target = primaries[index], (index + 1) % len(primaries)
        dest = primaries[target]
        dest.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[index])
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10):
            source.execute_command(
                "MIGRATE", "127.0.0.1", cluster.nodes[target].port, "", 0, 10_000, "KEYS", *keys
            )
            time.sleep(pause_s)  # the slot half-moved meanwhile, as a long reshard leaves it
        for primary in (dest, source, *primaries):  # the new owner first (as redis-cli)
            primary.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
    for primary in primaries:
        primary.close()
    return start, time.time()
