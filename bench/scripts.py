"""What each fire-path script costs Redis per task, and what its pieces cost.

``python -m bench scripts [N] [BATCH]``: N due tasks go through the poller's and the
consumer's scripts the way a node drives them (claim, its poller keeping the definitions,
enqueue, commit, the consumer's read and acknowledgement, outcome), BATCH due tasks per
partition per claim, and each script's Redis time is read from ``INFO
commandstats`` around its calls (``EVALSHA`` includes the commands it runs). Then the
pieces those scripts are made of (a hash read, a MessagePack unpack, a key concatenation,
...) are timed in a Lua loop inside Redis. No nodes, no Python on the clock: it says where
a fire's Redis microseconds go, and what a change to a script can save.
"""

from __future__ import annotations

from typing import Any

import msgpack
import redis
import trio

from actors.domain.model import TaskSpec
from actors.domain.schedules import Schedule
from actors.store.definitions import DefinitionCache
from actors.store.keys import GROUP
from actors.store.known_states import KnownStates
from actors.store.lua import records_prelude
from actors.store.replies import Fire, FireCommit, OutcomeWrite, fire_commit
from actors.store.tasks import TaskStore
from runtime.config import RedisSection
from runtime.redis_io import RedisClient

#: Every task is due once in the run (the next grid time is after it), and often enough that
#: its poller keeps its definition (``KEEP_IF_NEXT_WITHIN_MS``).
_EVERY_S = 300


def run(url: str, n: int, batch: int) -> dict[str, Any]:
    direct = redis.Redis.from_url(url)
    try:
        scripts = trio.run(_scripts, url, direct, n, batch)
        return {"tasks": n, "batch": batch, "scripts": scripts, "pieces": _pieces(direct)}
    finally:
        direct.close()


def _stats(direct: redis.Redis, command: str = "evalsha") -> tuple[int, float]:
    stats = direct.info("commandstats").get(f"cmdstat_{command}", {"calls": 0, "usec": 0})
    return int(stats["calls"]), float(stats["usec"])


async def _scripts(url: str, direct: redis.Redis, n: int, batch: int) -> dict[str, Any]:
    client = RedisClient.from_settings(url, RedisSection(url=url))
    store = TaskStore(client, "bench-scripts")
    now = await store.now_ms()
    every = Schedule("interval", every_s=_EVERY_S, start_ms=now - 1000)
    for start in range(0, n, 5000):
        await store.create_many([TaskSpec("t", every) for _ in range(min(5000, n - start))])
    scripts = await store.scripts()
    keys = await store.keys()
    partitions = list(range(keys.partitions))
    # The steady state: every task has run before (its first outcome also reads its state)
    for p in partitions:
        members: Any = direct.zrange(keys.schedule(p), 0, -1)
        ids = [m.decode() for m in members]
        for start in range(0, len(ids), 500):
            await scripts.record_outcomes(
                [OutcomeWrite(i, 0, now - 2000, "") for i in ids[start : start + 500]]
            )
    # The steady state of a poller: it keeps every due task's definition and the state it
    # committed last (here: commits that leave each grid where it was), so claims read
    # neither. Two rounds: the second claim finds every state known, and the next leave
    # the states out (actors/store/known_states.py).
    definitions = DefinitionCache(n)
    states = KnownStates(n)
    for warm in ("bench-warm-1", "bench-warm-2"):
        warmed = await scripts.claim_due(
            partitions, "bench", warm, n, 60_000, definitions=definitions, states=states
        )
        unmoved = {c.partition: [fire_commit(t, t.due_ms, t.due_ms, 0) for t in c.tasks]
                   for c in warmed}  # fmt: skip
        warm_writes = {c.partition: c.writes for c in warmed}
        done = await scripts.commit_fires("bench", warm, unmoved, warm_writes)
        for p, items in unmoved.items():
            assert not done[p].lost
            states.committed(p, warm_writes[p], items)
    names = ("claim", "enqueue", "commit", "read", "ack", "outcome")
    cost = {name: [0, 0.0, 0] for name in names}
    stream = keys.queue("t")
    direct.xgroup_create(stream, GROUP, id="0", mkstream=True)

    async def measured(name: str, tasks: int, call: Any, command: str = "evalsha") -> None:
        calls, usec = _stats(direct, command)
        await call()
        calls_after, usec_after = _stats(direct, command)
        entry = cost[name]
        entry[0] += calls_after - calls
        entry[1] += usec_after - usec
        entry[2] += tasks

    tick = 0
    while True:
        tick += 1
        token = f"bench-{tick}"
        claims: list[Any] = []

        async def claim(token: str = token, claims: list[Any] = claims) -> None:
            claims += await scripts.claim_due(
                partitions, "bench", token, batch, 60_000, definitions=definitions, states=states
            )

        await measured("claim", 0, claim)
        tasks = [(c.partition, t) for c in claims for t in c.tasks]
        if not tasks:
            break
        cost["claim"][2] += len(tasks)
        fires = [
            Fire(t.task_id, t.type, t.payload, t.due_ms, prior=t.prior_claim) for _, t in tasks
        ]
        await measured(
            "enqueue", len(tasks), lambda f=fires, tok=token: scripts.enqueue(f, now, 60_000, tok)
        )
        commits: dict[int, list[FireCommit]] = {}
        for partition, t in tasks:
            nxt = t.due_ms + _EVERY_S * 1000
            commits.setdefault(partition, []).append(fire_commit(t, nxt, nxt, 1))
        writes = {c.partition: c.writes for c in claims}
        await measured(
            "commit", len(tasks),
            lambda c=commits, tok=token, w=writes: scripts.commit_fires("bench", tok, c, w),
        )  # fmt: skip
        for partition, items in commits.items():
            states.committed(partition, writes[partition], items)
        read: list[str] = []

        async def read_group(n: int = len(tasks), read: list[str] = read) -> None:
            reply: Any = direct.xreadgroup(GROUP, "bench", {stream: ">"}, count=n)
            read += [entry_id.decode() for entry_id, _ in reply[0][1]]

        await measured("read", len(tasks), read_group, "xreadgroup")
        await measured("ack", len(tasks), lambda ids=read: scripts.ack("t", ids))
        outcomes = [OutcomeWrite(t.task_id, 0, now, "") for _, t in tasks]
        await measured("outcome", len(tasks), lambda o=outcomes: scripts.record_outcomes(o))
    await client.aclose()
    return {
        name: {
            "us_per_task": round(usec / max(1, tasks), 2),
            "us_per_call": round(usec / max(1, calls), 1),
            "calls": calls,
        }
        for name, (calls, usec, tasks) in cost.items()
    }


#: Lua bodies timed per iteration, against a bucket hash of 60 task states ({x}:state:1).
_PIECES = {
    "loop": "",
    "bucket_of": "local b = bucket_of(id, 1024)",
    "key_concat": "local k = tag .. ':state:' .. 7",
    "hget": "local raw = redis.call('HGET', '{x}:state:1', id)",
    "hget_unpack": "local s = get_state('{x}', 1, id)",
    "unpack": "local s = {cmsgpack.unpack(raw0)}",
    "pack": "local p = cmsgpack.pack(s0[1], s0[2], s0[3], s0[4], s0[5], s0[6], s0[7], s0[8])",
    "hset": "redis.call('HSET', '{x}:state:1', id, raw0)",
    "zadd": "redis.call('ZADD', '{x}:z', 1796095213547, id)",
    "format_ms": "local m = ms(1796095213547)",
    "tonumber": "local m = tonumber('1796095213547')",
}


def _pieces(direct: redis.Redis, iterations: int = 20_000) -> dict[str, float]:
    state = b"".join(
        msgpack.packb(v) for v in (0, 1796095213547, 12, 1796095000000, 10, None, 17960952, 0)
    )
    direct.delete("{x}:state:1", "{x}:z")
    direct.hset("{x}:state:1", mapping={f"task{i:08d}": state for i in range(60)})
    out = {}
    for name, body in _PIECES.items():
        source = records_prelude() + (
            "local tag = '{x}'\n"
            "local raw0 = redis.call('HGET', '{x}:state:1', 'task00000001')\n"
            "local s0 = {cmsgpack.unpack(raw0)}\n"
            f"for i = 1, {iterations} do\n"
            "  local id = 'task000000' .. string.format('%02d', i % 60)\n"
            f"  {body}\n"
            "end\nreturn 1\n"
        )
        sha = direct.script_load(source)
        _, before = _stats(direct)
        direct.evalsha(sha, 0)
        _, after = _stats(direct)
        out[name] = round((after - before) / iterations, 2)
    loop = out.pop("loop")
    return {"loop_us": loop} | {f"{k}_us": round(v - loop, 2) for k, v in out.items()}
