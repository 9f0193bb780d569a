"""``bench drain N``: how fast one consumer process empties a stream, and its CPU a message.

The consumer's own figure, without a poller beside it: N messages are appended to a
type's stream first (one script, no tasks behind them: outcomes find no task and write
nothing), then one node with ``[processes] consumers = 1`` and no poller, the default
``info`` logging and the benchmark's no-op recording handler at concurrency 1,000, reads
them all. Timed from its first read to the last acknowledgement; CPU from the node's
processes over the same window. At 20,000 fires/s on 2 cores the consumer process is the
limit (docs/PERFORMANCE.md), so this is the number that moves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.common import redis_cpu_seconds
from bench.fire import REPO, part_names, process_cpu

_APPEND = """
local now = ARGV[2]
for i = 1, tonumber(ARGV[1]) do
  local id = 'b' .. (tonumber(ARGV[3]) + i)
  -- the compact message a poller of this version appends (actors/store/messages.py)
  redis.call('XADD', KEYS[1], '*', 'task_id', id, 'payload', '{"n": 1}', 'attempt', '0',
    'due_ms', now)
end
"""

_CONFIG = """namespace = "bench"
[node]
name = "drain-0"
[log]
level = "info"
[redis]
url = "{url}"
[scheduler]
pollers = 0
[execution]
results_log = "{workdir}/results.jsonl"
retry_dispatchers = 0
[consumers.bench]
handler = "bench.handlers:record"
concurrency = {concurrency}
[processes]
consumers = 1
"""


def run(url: str, n: int, concurrency: int = 1000, timeout_s: float = 600.0) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    workdir = Path(tempfile.mkdtemp(prefix="metronome-drain-"))
    stream = "{bench:q:bench}:queue"
    client.xgroup_create(stream, "metronome", "0", mkstream=True)
    now = str(int(time.time() * 1000))
    for start in range(0, n, 10_000):
        client.eval(_APPEND, 1, stream, min(10_000, n - start), now, start)
    config = workdir / "node.toml"
    config.write_text(_CONFIG.format(url=url, workdir=workdir, concurrency=concurrency))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "METRONOME_BENCH_DIR": str(workdir),
    }
    with (workdir / "node-0.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )  # fmt: skip
    try:
        deadline = time.time() + timeout_s

        def group() -> dict[str, Any]:
            if time.time() > deadline:
                raise SystemExit(f"drain: not done within {timeout_s} s (see {workdir})")
            info: dict[str, Any] = client.xinfo_groups(stream)[0]
            return info

        while not (first := group())["entries-read"]:
            time.sleep(0.005)
        read_before = int(first["entries-read"])
        t0, cpu0, redis0 = time.time(), process_cpu([proc]), redis_cpu_seconds(url)
        while True:
            info = group()
            if int(info["entries-read"]) >= n and not info["pending"]:
                break
            time.sleep(0.005)
        elapsed = time.time() - t0
        cpu1, redis1 = process_cpu([proc]), redis_cpu_seconds(url)
    finally:
        proc.terminate()
        proc.wait(30)
        client.close()
    timed = max(1, n - read_before)
    names = part_names(workdir, 1)
    return {
        "messages": n,
        "timed": timed,
        "per_s": round(timed / elapsed),
        "cpu_us_per_message": {
            names.get(name, name): round((used - cpu0.get(name, 0.0)) / timed * 1e6, 1)
            for name, used in cpu1.items()
        },
        "redis_cpu_us_per_message": round((redis1 - redis0) / timed * 1e6, 1),
        "workdir": str(workdir),
    }
