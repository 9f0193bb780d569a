"""``python -m bench fire N INTERVAL_S DURATION_S``: end-to-end fires with real nodes.

Registers N periodic tasks (ids ``b0``..``b<N-1>``) of one type through the store's bulk
path, phased evenly (task i first due at t0 + i/N * INTERVAL_S), starts ``--nodes K`` real
``python -m runtime`` processes (each a poller and a consumer of the type, no-op handler
``bench.handlers:record``), runs until t0 + DURATION_S, stops them with SIGTERM, and reads
the handlers' local records. Over the window [t0 + INTERVAL_S, t0 + DURATION_S - INTERVAL_S]:
lag = handler start - due time; missed = due fires never started; duplicates = fires
started more than once. CPU (Redis's and the nodes') is measured over [t0 + INTERVAL_S,
t0 + DURATION_S] (from t0 with ``--chaos``): every task has fired once before it, as on a
node that has been running a while (the first pass also reads each definition into the
poller's cache, and writes each task's first run record).
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from actors.config import new_namespace_partitions
from actors.domain.model import TaskSpec
from actors.domain.schedules import Misfire, Overlap, Schedule
from actors.store.tasks import TaskStore
from bench.common import (
    child_pids,
    command_costs,
    command_stats,
    cpu_seconds,
    percentile,
    redis_cpu_times,
    tree_cpu_seconds,
    used_memory,
)
from bench.handlers import is_flaky
from bench.schedule import register
from bench.scrape import Scraper
from runtime.config import RedisSection
from runtime.redis_io import RedisClient
from runtime.testing.local_redis import free_port

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench"


def node_toml(
    workdir: Path, url: str, index: int, concurrency: int, log_level: str, role: str = "all",
    handler: str = "bench.handlers:record", lease_s: float = 30.0, processes: int = 0,
    backoff_base_s: float = 10.0, cluster: bool = False, metrics_port: int = 0,
    settings: tuple[str, ...] = (), types: int = 1,
) -> Path:  # fmt: skip
    """A node's config; ``role`` is "all" (poller and consumer), "poller" or "consumer";
    ``types``: a consumer section (``concurrency`` slots) for each of ``task_types(types)``;
    ``processes`` > 0: the poller in a child process and that many consumer processes;
    ``settings``: ``section.key=value`` lines (TOML values) put into their sections."""
    path = workdir / f"node-{index}.toml"
    pollers = 0 if role == "consumer" else 1
    consumers = (
        ""
        if role == "poller"
        else "".join(
            f'[consumers.{name}]\nhandler = "{handler}"\nconcurrency = {concurrency}\n'
            f"lease_s = {lease_s}\nbackoff_base_s = {backoff_base_s}\n"
            for name in task_types(types)
        )
    )
    path.write_text(
        f'namespace = "{NAMESPACE}"\n'
        f'[node]\nname = "bench-{index}"\nshutdown_grace_s = 10\n'
        f'[log]\nlevel = "{log_level}"\n'
        f'[redis]\nurl = "{url}"\ncluster = {str(cluster).lower()}\n'
        f"[scheduler]\npollers = {pollers}\n"
        f'[execution]\nresults_log = "{workdir / f"results-{index}.jsonl"}"\n'
        f"{consumers}"
        + (f"[processes]\nscheduler = 1\nconsumers = {processes}\n" if processes else "")
        # cache_s = 0: every scrape reads Redis (the worst case a scrape can cost); no
        # background status count, which would blur the per-scrape figures
        + (
            f'[metrics]\nbind = "127.0.0.1:{metrics_port}"\ncache_s = 0\n'
            "status_count_interval_s = 0\n"
            if metrics_port
            else ""
        )
    )
    if settings:
        path.write_text(_with_settings(path.read_text(), settings))
    return path


def task_types(types: int) -> list[str]:
    """The task types of a run: ``bench``, or ``bench0``..``bench<K-1>`` (task ``b<i>`` is
    of the ``i % K``-th). Each type has its own stream: on a Redis Cluster, its own slot."""
    return ["bench"] if types == 1 else [f"bench{k}" for k in range(types)]


def _with_settings(text: str, settings: tuple[str, ...]) -> str:
    """``text`` with each ``section.key=value`` added to its section (a new one if the
    config has none). A section like ``consumers.bench`` is named in full."""
    lines = text.splitlines()
    for setting in settings:
        name, sep, value = setting.partition("=")
        section, dot, key = name.strip().rpartition(".")
        if not (sep and dot and section and key):
            raise SystemExit(f"--set {setting!r}: expected section.key=value")
        header = f"[{section}]"
        at = lines.index(header) + 1 if header in lines else None
        if at is None:
            lines += [header, f"{key} = {value.strip()}"]
        else:
            lines.insert(at, f"{key} = {value.strip()}")
    return "\n".join(lines) + "\n"


def start_nodes(
    workdir: Path, url: str, nodes: int, concurrency: int, log_level: str, split: bool = False,
    first: int = 0, wait_ms: float = 0.0, **node_options: Any,
) -> list[subprocess.Popen[bytes]]:  # fmt: skip
    """``nodes`` node processes; with ``split``, node 0 only polls and the others only
    consume (each role gets its own node, so its own GIL); ``processes=K`` in
    ``node_options`` gives each node a scheduler process and K consumer processes;
    ``wait_ms``: what ``bench.handlers:record_wait`` waits."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        ).rstrip(os.pathsep),
        "METRONOME_BENCH_DIR": str(workdir),
        "METRONOME_BENCH_WAIT_MS": str(wait_ms),
    }
    procs = []
    for i in range(first, first + nodes):
        role = ("poller" if i == 0 else "consumer") if split else "all"
        config = node_toml(workdir, url, i, concurrency, log_level, role, **node_options)
        # Appended (>>), so that the node's child processes write their lines there
        # themselves (runtime.logging.output_is_a_file), as a node logging to a file does.
        with (workdir / f"node-{i}.log").open("ab") as log:  # the child keeps its own copy
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "runtime", str(config)],
                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                )
            )  # fmt: skip
    return procs


def stop_nodes(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(
    url: str, n: int, interval_s: float, duration_s: float, nodes: int, concurrency: int,
    log_level: str, split: bool = False, processes: int = 0, chaos_every_s: float = 0.0,
    flaky: bool = False, scrape_every_s: float = 0.0, shards: list[str] | None = None,
    settings: tuple[str, ...] = (), overlap: Overlap = "allow_all", types: int = 1,
    wait_ms: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    """``wait_ms`` > 0: each handler waits that long after recording its start, as an I/O
    call would (``bench.handlers:record_wait``). ``types``: the tasks spread over that many
    task types (streams; ``task_types``).
    ``overlap``: every task's overlap policy (its cost a fire: the handler is quick, so
    every fire runs whatever the policy). ``chaos_every_s`` > 0: SIGKILL a random child
    process of the node that often (it is restarted by the node), until the last kill's
    fires can no longer miss the window.
    ``flaky``: one fire in ten fails its first attempt and must succeed on its retry
    (0.2 s backoff): the retry path under the same conditions."""
    if types < 1:
        raise SystemExit("--types: at least 1")
    if split and nodes < 2:
        raise SystemExit("--split needs --nodes 2 or more (one poller node, consumer nodes)")
    if split and processes:
        raise SystemExit("--split and --processes are two ways to split roles: pick one")
    if chaos_every_s and not processes:
        raise SystemExit("--chaos kills a node's child processes: it needs --processes")
    if chaos_every_s and chaos_every_s < 2:
        raise SystemExit("--chaos: at most one kill per 2 s (the node gives up past 3 in 5 s)")
    if wait_ms < 0:
        raise SystemExit("--wait-ms: 0 or more")
    if wait_ms and (flaky or chaos_every_s):
        raise SystemExit("--wait-ms goes with neither --flaky nor --chaos")
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-"))
    servers = shards or [url]  # a Redis Cluster's masters, or the one server
    baseline = sum(used_memory(u) for u in servers)
    partitions = _partitions_set(settings)
    t0_ms, register_s = trio.run(
        _register, url, n, interval_s, "coalesce", bool(shards), partitions, overlap, types
    )
    bytes_per_task = (sum(used_memory(u) for u in servers) - baseline) / n
    options: dict[str, Any] = {"cluster": True} if shards else {}
    if chaos_every_s:
        options |= {"handler": "bench.handlers:record_flushed", "lease_s": 2.0}
    if types > 1:
        options["types"] = types
    if settings:
        options["settings"] = settings
    if wait_ms:
        options["handler"] = "bench.handlers:record_wait"
    if flaky:
        options["handler"] = "bench.handlers:record_flaky"
        options["backoff_base_s"] = 0.2
    scraper = None
    if scrape_every_s:
        options["metrics_port"] = free_port()
        scraper = Scraper(f"http://127.0.0.1:{options['metrics_port']}/metrics", scrape_every_s)
    procs = start_nodes(
        workdir, url, nodes, concurrency, log_level, split, processes=processes,
        wait_ms=wait_ms, **options,
    )  # fmt: skip
    kills: list[int] = []
    try:
        end_s = t0_ms / 1000 + duration_s
        # The CPU window opens once every task has fired (the steady state: see above);
        # with --chaos at t0, so the kills start there (the figures are not the point then).
        warm_s = 0.0 if chaos_every_s else interval_s
        time.sleep(max(0.0, t0_ms / 1000 + warm_s - time.time()))
        cpu_start = {p.pid: tree_cpu_seconds(p.pid) for p in procs}
        process_start = process_cpu(procs)
        redis_start = [redis_cpu_times(u) for u in servers]
        commands_start = [command_stats(u) for u in servers]
        cpu_t = time.time()
        if scraper is not None:
            scraper.start()
        # A killed poller's claims come back after claim_lease_ms (10 s): stop killing early
        # enough that every fire in the window can still start before the end.
        last_kill_s = end_s - interval_s - 12
        while chaos_every_s and time.time() + chaos_every_s < last_kill_s:
            time.sleep(chaos_every_s)
            kills.append(_kill_a_child(procs[0].pid))
        time.sleep(max(0.0, end_s - time.time()))
        cpu_used = sum(tree_cpu_seconds(p.pid) - cpu_start[p.pid] for p in procs)
        elapsed = max(1e-9, time.time() - cpu_t)
        cpu_pct = 100 * cpu_used / elapsed
        redis_end = [redis_cpu_times(u) for u in servers]
        redis_used = [end[0] - start[0] for start, end in zip(redis_start, redis_end, strict=True)]
        redis_sys = sum(
            end[1] - start[1] for start, end in zip(redis_start, redis_end, strict=True)
        )
        commands_end = [command_stats(u) for u in servers]
        # Memory while running: the tasks plus whatever the fire path keeps (streams'
        # backlog, dedupe markers), over the same baseline as the idle figure.
        running_bytes = (sum(used_memory(u) for u in servers) - baseline) / n
        process_used = {
            name: used - process_start.get(name, 0.0) for name, used in process_cpu(procs).items()
        }
    finally:
        if scraper is not None:
            scraper.stop()
        stop_nodes(procs)
    figures = _analyse(workdir, n, interval_s, duration_s, t0_ms, flaky)
    if scraper is not None:
        figures["scrapes"] = scraper.figures()
    # Per fire: CPU over the measured window divided by the fires run in it (at the rate
    # the run executed; fires are spread evenly over the interval).
    fires = max(1.0, figures["exec_per_s"] * elapsed)
    figures["redis_cpu_us_per_fire"] = round(1e6 * sum(redis_used) / fires, 1)
    figures["redis_sys_cpu_us_per_fire"] = round(1e6 * redis_sys / fires, 1)
    figures["redis_cpu_pct_per_shard"] = [round(100 * r / elapsed, 1) for r in redis_used]
    # What the Redis time is made of: [calls, us] per fire for each command (a script's
    # own calls listed beside it; EVALSHA's time includes theirs)
    figures["redis_commands_per_fire"] = command_costs(commands_start, commands_end, fires)
    figures["node_cpu_us_per_fire"] = round(1e6 * cpu_used / fires, 1)
    parts = part_names(workdir, len(procs))
    figures["process_cpu_pct"] = {
        parts.get(k, k): round(100 * v / elapsed, 1) for k, v in process_used.items()
    }
    return {
        "n": n, "interval_s": interval_s, "duration_s": duration_s, "nodes": nodes,
        "split": split, "processes": processes, "shards": len(servers) if shards else 0,
        **({"types": types} if types > 1 else {}),
        "register_s": round(register_s, 2), **figures,
        **({"chaos_every_s": chaos_every_s, "kills": len(kills)} if chaos_every_s else {}),
        **({"flaky": True} if flaky else {}),
        **({"wait_ms": wait_ms} if wait_ms else {}),
        **({"overlap": overlap} if overlap != "allow_all" else {}),
        "redis_bytes_per_task": round(bytes_per_task),
        "redis_bytes_per_task_running": round(running_bytes), "node_cpu_pct": round(cpu_pct, 1),
        "workdir": str(workdir),
    }  # fmt: skip


def process_cpu(procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """CPU seconds of every node process and its child processes, by name
    (``node-0``, ``node-0/<pid>``: a child's part shows in its node's log)."""
    out = {}
    for i, proc in enumerate(procs):
        try:
            out[f"node-{i}"] = cpu_seconds(proc.pid)
        except OSError:
            continue
        for child in child_pids(proc.pid):
            try:
                out[f"node-{i}/{child}"] = cpu_seconds(child)
            except OSError:
                continue
    return out


def part_names(workdir: Path, nodes: int) -> dict[str, str]:
    """``node-0/<pid>`` -> ``node-0/scheduler`` etc., from the nodes' ``process_started``
    lines (the last start of each part wins)."""
    names = {}
    for i in range(nodes):
        log = workdir / f"node-{i}.log"
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if '"process_started"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            names[f"node-{i}/{event['pid']}"] = f"node-{i}/{event['actor'].rsplit('/', 1)[1]}"
    return names


def _kill_a_child(node_pid: int) -> int:
    """SIGKILL one child process of the node, chosen at random; its pid."""
    children = child_pids(node_pid)
    if not children:
        return 0
    victim = random.choice(children)
    os.kill(victim, signal.SIGKILL)
    return victim


def _partitions_set(settings: tuple[str, ...]) -> int | None:
    """``--set scheduler.partitions=N``: the namespace is created with N partitions (the
    registration creates it, before any node reads the setting); None: the store's default."""
    for setting in settings:
        name, _, value = setting.partition("=")
        if name.strip() == "scheduler.partitions":
            return int(value)
    return None


async def _register(
    url: str, n: int, interval_s: float, misfire: Misfire = "coalesce", cluster: bool = False,
    partitions: int | None = None, overlap: Overlap = "allow_all", types: int = 1,
) -> tuple[int, float]:  # fmt: skip
    client = RedisClient.from_settings(url, RedisSection(url=url, cluster=cluster))
    # As a node would create it: 64 partitions on a Cluster unless set (actors.config).
    store = TaskStore(
        client, NAMESPACE, default_partitions=new_namespace_partitions(partitions, cluster)
    )
    now = await store.now_ms()
    # t0: after registration (measured >= 20k tasks/s here) and node start-up, with slack.
    t0 = now + 5000 + n * 1000 // 15_000
    interval_ms = int(interval_s * 1000)
    names = task_types(types)
    specs = [
        TaskSpec(
            names[i % len(names)],
            Schedule(
                "interval",
                every_s=interval_s,
                start_ms=t0 + i * interval_ms // n,
                misfire=misfire,
                overlap=overlap,
            ),
            task_id=f"b{i}",
        )
        for i in range(n)
    ]
    took = await register(store, specs)
    await client.aclose()
    return t0, took


def _analyse(
    workdir: Path, n: int, interval_s: float, duration_s: float, t0: int, flaky: bool = False
) -> dict[str, Any]:
    interval_ms = int(interval_s * 1000)
    lo, hi = t0 + interval_ms, t0 + int(duration_s * 1000) - interval_ms
    starts: Counter[tuple[str, int]] = Counter()
    attempts: Counter[tuple[str, int, int]] = Counter()
    lags: list[float] = []
    for path in glob.glob(str(workdir / "fires-*.txt")):
        with open(path) as lines:
            for line in lines:
                task_id, due_text, start, *attempt = line.split()
                due_ms = int(due_text)
                if lo <= due_ms <= hi:
                    starts[(task_id, due_ms)] += 1
                    attempts[(task_id, due_ms, int(attempt[0]) if attempt else 0)] += 1
                    if starts[(task_id, due_ms)] == 1:
                        lags.append(float(start) - due_ms)
    expected = 0
    missed = 0
    for i in range(n):
        first = t0 + i * interval_ms // n
        k = max(0, -(-(lo - first) // interval_ms))
        due = first + k * interval_ms
        while due <= hi:
            expected += 1
            if (f"b{i}", due) not in starts:
                missed += 1
            due += interval_ms
    window_s = (hi - lo) / 1000
    executed = len(starts)
    return {
        "expected": expected,
        "executed": executed,
        "exec_per_s": round(executed / window_s) if window_s > 0 else 0,
        "lag_p50_ms": round(percentile(lags, 50), 1),
        "lag_p99_ms": round(percentile(lags, 99), 1),
        "lag_max_ms": round(max(lags), 1) if lags else None,
        "missed": missed,
        # The same attempt of a fire started twice (a retry is another attempt, not one).
        "duplicates": sum(1 for c in attempts.values() if c > 1),
        **(_retries(attempts) if flaky else {}),
    }


def _retries(attempts: Counter[tuple[str, int, int]]) -> dict[str, Any]:
    """With ``--flaky``: how many fires failed their first attempt, and how many of those
    never started their retry (lost in the retry path)."""
    failed = {(t, d) for (t, d, a) in attempts if a == 0 and is_flaky(t, d)}
    retried = {(t, d) for (t, d, a) in attempts if a > 0}
    return {"failed_first": len(failed), "retries_lost": len(failed - retried)}
