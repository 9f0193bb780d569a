"""``python -m bench bullmq N INTERVAL_S DURATION_S``: BullMQ's side of ``bench fire``.

The comparison in docs/PERFORMANCE.md, repeatable: the same fires driven through BullMQ (the
version pinned in ``bench/peers/bullmq/package.json``) on a Redis this benchmark starts, measured
exactly as ``bench fire`` measures Metronome. N job schedulers ``b0``..``b<N-1>``, each
``every`` INTERVAL_S with a start date spread over the interval (scheduler i first due at
t0 + i/N * INTERVAL_S, the grid ``bench fire`` uses); finished jobs are removed
(``removeOnComplete``), as a production user would set. ``--workers W`` Node.js processes,
each one ``Worker`` with ``--concurrency C`` and a no-op processor that records when it
started each fire in a local file; ``bench.fire``'s analysis reads those files (lag =
start - due, missed, duplicates over the same window). CPU per fire: Redis from ``INFO
cpu``, the worker processes from /proc.

Needs Node.js and npm; the first run installs the pinned BullMQ from the npm registry
(``npm ci`` into ``bench/peers/bullmq/node_modules``). Not part of the test suite.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import command_costs, command_stats, cpu_seconds, redis_cpu_times
from bench.fire import _analyse

PEER = Path(__file__).resolve().parent / "peers" / "bullmq"
#: Time to register each scheduler, generously (measured 0.15 ms here): t0 is put after it.
_REGISTER_S_PER_TASK = 0.0003


def run(
    url: str, n: int, interval_s: float, duration_s: float, workers: int, concurrency: int
) -> dict[str, Any]:
    node = _install()
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-bullmq-"))
    interval_ms = int(interval_s * 1000)
    t0_ms = int((time.time() + 5 + n * _REGISTER_S_PER_TASK) * 1000)
    started = time.monotonic()
    subprocess.run(
        [node, "register.mjs", url, str(n), str(interval_ms), str(t0_ms)], cwd=PEER, check=True
    )
    register_s = time.monotonic() - started
    if time.time() * 1000 > t0_ms:
        raise SystemExit(f"registering {n} schedulers took {register_s:.1f} s, past t0")
    procs = [
        subprocess.Popen([node, "worker.mjs", url, str(concurrency), str(workdir)], cwd=PEER)
        for _ in range(workers)
    ]
    try:
        time.sleep(max(0.0, t0_ms / 1000 - time.time()))
        cpu_start = [cpu_seconds(p.pid) for p in procs]
        redis_start = redis_cpu_times(url)
        commands_start = command_stats(url)
        cpu_t = time.time()
        time.sleep(max(0.0, t0_ms / 1000 + duration_s - time.time()))
        elapsed = time.time() - cpu_t
        cpu_used = [cpu_seconds(p.pid) - c for p, c in zip(procs, cpu_start, strict=True)]
        redis_end = redis_cpu_times(url)
        commands_end = command_stats(url)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    figures = _analyse(workdir, n, interval_s, duration_s, t0_ms)
    fires = max(1.0, figures["exec_per_s"] * elapsed)
    return {
        "n": n, "interval_s": interval_s, "duration_s": duration_s, "workers": workers,
        "concurrency": concurrency, "register_s": round(register_s, 2), **figures,
        "redis_cpu_us_per_fire": round(1e6 * (redis_end[0] - redis_start[0]) / fires, 1),
        "redis_cpu_pct": round(100 * (redis_end[0] - redis_start[0]) / elapsed, 1),
        "redis_commands_per_fire": command_costs([commands_start], [commands_end], fires),
        "worker_cpu_us_per_fire": round(1e6 * sum(cpu_used) / fires, 1),
        "process_cpu_pct": {
            f"worker-{i}": round(100 * used / elapsed, 1) for i, used in enumerate(cpu_used)
        },
        "workdir": str(workdir),
    }  # fmt: skip


def _install() -> str:
    """The ``node`` binary, with the pinned BullMQ installed beside the harness."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise SystemExit("bench bullmq needs Node.js and npm on PATH (Debian: nodejs, npm)")
    if not (PEER / "node_modules" / "bullmq").is_dir():
        installed = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PEER)
        if installed.returncode != 0:
            raise SystemExit(
                f"bench bullmq: `npm ci` in {PEER} failed (exit {installed.returncode}); "
                "it needs the npm registry once, to install the pinned BullMQ"
            )
    return node
