"""``python -m bench api``: the HTTP API under load, from a second process on loopback.

Starts one node serving the API (``[api]``, no consumers; ``--processes N``: N API
processes sharing the port, ``[processes] api = N``; tasks are created with
a first fire in 2100 so the scheduler stays idle), then, from this process, with signed
requests through ``actors.admin.client`` (what users and the CLI use):

1. bulk: ``--bulk-total`` tasks in requests of ``--bulk-size`` from ``--bulk-senders``
   threads (each sends its next request when its last is answered) → tasks/s;
2. single, flat out: ``--workers`` threads creating one task per request for
   ``--seconds`` / 2 → creates/s;
3. single, steady: an open-loop load of ``--rate`` creates/s for ``--seconds``; latency is
   measured from each request's *scheduled* send time, so a stall delays every request
   behind it and shows in the percentiles (no coordinated omission) → p50/p99/max;
4. the HTTP floor: ``GET /healthz`` flat out (no signature, no Redis) → requests/s and the
   node's CPU per request, what the server costs before any work is done.

The targets: bulk >= 20,000 tasks/s; single >= 1,000/s with p99 <= 50 ms (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from actors.admin.client import ApiError, Client
from actors.api.signing import sign
from actors.domain.api_keys import ApiKey
from bench.common import percentile, tree_cpu_seconds
from bench.fire import REPO, stop_nodes

KEY = ("bench", "bench-secret-0123456789")
SCHEDULE = {"kind": "interval", "every_s": 3600, "start_ms": 4102444800000}


class LeanClient:
    """Signed single creates over one keep-alive ``http.client`` connection.

    The load generator shares the 2 cores with the node; httpx (what ``actors.admin.client``
    uses) costs the generator about as much CPU per request as the server spends, so the
    single-create phases measure the server with this: the same signature
    (``actors.api.signing.sign``), a tenth of the client overhead. ``--client httpx`` measures
    with ``actors.admin.client`` instead.
    """

    def __init__(self, base: str, key_id: str, secret: str) -> None:
        host, _, port = base.removeprefix("http://").rpartition(":")
        self.http = http.client.HTTPConnection(host, int(port), timeout=30)
        self.key = ApiKey(key_id, secret.encode())

    def __enter__(self) -> LeanClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.http.close()

    def create_task(self, task_type: str, schedule: dict[str, Any], payload: Any) -> None:
        body = {"type": task_type, "schedule": schedule, "payload": payload}
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = sign(self.key, "POST", "/v1/tasks", data, int(time.time() * 1000))
        headers["Content-Type"] = "application/json"
        self.http.request("POST", "/v1/tasks", body=data, headers=headers)
        response = self.http.getresponse()
        answer = response.read()
        if response.status != 201:
            raise ApiError(response.status, "error", answer[:300].decode(errors="replace"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(
    workdir: Path, url: str, port: int, log_level: str, processes: int
) -> subprocess.Popen[bytes]:
    config = workdir / "api-node.toml"
    config.write_text(
        f'namespace = "benchapi"\n[node]\nname = "bench-api"\n[log]\nlevel = "{log_level}"\n'
        f'[redis]\nurl = "{url}"\n[api]\nbind = "127.0.0.1:{port}"\nmax_bulk = 20000\n'
        f'[[api.keys]]\nid = "{KEY[0]}"\nsecret = "{KEY[1]}"\n'
        + (f"[processes]\napi = {processes}\n" if processes else "")
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        ).rstrip(os.pathsep),
    }
    with (workdir / "api-node.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the API node did not become ready; see {workdir / 'api-node.log'}")


def run(
    url: str, rate: int, seconds: float, bulk_total: int, bulk_size: int, workers: int,
    log_level: str, bulk_senders: int = 2, processes: int = 0, client: str = "lean",
) -> dict[str, Any]:  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="metronome-bench-api-"))
    port = _free_port()
    node = _start_node(workdir, url, port, log_level, processes)
    base = f"http://127.0.0.1:{port}"
    try:
        cpu0 = tree_cpu_seconds(node.pid)
        bulk = _bulk(base, bulk_total, bulk_size, bulk_senders)
        single = LeanClient if client == "lean" else Client
        flat_out = _closed_loop(base, workers, seconds / 2, single)
        cpu1, client_cpu = tree_cpu_seconds(node.pid), time.process_time()
        steady = _open_loop(base, rate, seconds, workers, single)
        requests = max(1, steady["requests"])
        steady["node_cpu_ms_per_request"] = round(
            (tree_cpu_seconds(node.pid) - cpu1) / requests * 1000, 2
        )
        steady["client_cpu_ms_per_request"] = round(
            (time.process_time() - client_cpu) / requests * 1000, 2
        )
        cpu = tree_cpu_seconds(node.pid) - cpu0
        floor = _healthz(base, workers, min(5.0, seconds / 2), node.pid)
    finally:
        stop_nodes([node])
    return {"bulk": bulk, "single_max": flat_out, "single_steady": steady,
            "healthz_max": floor, "node_cpu_s": round(cpu, 1), "log_level": log_level,
            "api_processes": processes, "client": client}  # fmt: skip


def _bulk(base: str, total: int, size: int, senders: int) -> dict[str, Any]:
    tag = f"bulk{time.monotonic_ns()}"
    latencies: list[float] = []
    starts = list(range(0, total, size))

    def sender(index: int) -> None:
        with Client(base, *KEY) as api:
            for first in starts[index::senders]:
                tasks = [
                    {"type": "bench", "schedule": SCHEDULE, "task_id": f"{tag}-{i}",
                     "payload": {"i": i}}
                    for i in range(first, min(total, first + size))
                ]  # fmt: skip
                t = time.perf_counter()
                result = api.create_tasks(tasks)
                latencies.append(time.perf_counter() - t)
                assert result["created"] == len(tasks), result

    started = time.perf_counter()
    _run_threads(sender, senders)
    elapsed = time.perf_counter() - started
    return {
        "tasks": total,
        "per_request": size,
        "senders": senders,
        "tasks_per_s": round(total / elapsed),
        "request_p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "request_max_ms": round(max(latencies) * 1000, 1),
    }


def _closed_loop(base: str, workers: int, seconds: float, single: Any) -> dict[str, Any]:
    counts = [0] * workers
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    def worker(index: int) -> None:
        with single(base, *KEY) as api:
            while time.perf_counter() < deadline:
                try:
                    api.create_task("bench", SCHEDULE, {"w": index})
                    counts[index] += 1
                except ApiError as exc:
                    errors.append(str(exc))

    started = time.perf_counter()
    _run_threads(worker, workers)
    elapsed = time.perf_counter() - started
    return {
        "workers": workers,
        "creates_per_s": round(sum(counts) / elapsed),
        "errors": len(errors),
    }


def _healthz(base: str, workers: int, seconds: float, pid: int) -> dict[str, Any]:
    counts = [0] * workers
    deadline = time.perf_counter() + seconds

    def worker(index: int) -> None:
        with httpx.Client() as http:
            while time.perf_counter() < deadline:
                http.get(base + "/healthz")
                counts[index] += 1

    cpu0, started = tree_cpu_seconds(pid), time.perf_counter()
    _run_threads(worker, workers)
    elapsed, cpu = time.perf_counter() - started, tree_cpu_seconds(pid) - cpu0
    total = sum(counts)
    return {"requests_per_s": round(total / elapsed), "node_cpu_ms_per_request":
            round(cpu / total * 1000, 2)}  # fmt: skip


def _open_loop(base: str, rate: int, seconds: float, workers: int, single: Any) -> dict[str, Any]:
    total = int(rate * seconds)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    t0 = time.perf_counter() + 0.5

    def worker(index: int) -> None:
        mine: list[float] = []
        with single(base, *KEY) as api:
            for j in range(index, total, workers):
                due = t0 + j / rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                try:
                    api.create_task("bench", SCHEDULE, {"j": j})
                except ApiError as exc:
                    with lock:
                        errors.append(str(exc))
                mine.append(time.perf_counter() - due)
        with lock:
            latencies.extend(mine)

    _run_threads(worker, workers)
    elapsed = time.perf_counter() - t0
    return {
        "target_per_s": rate,
        "achieved_per_s": round(len(latencies) / elapsed),
        "requests": len(latencies),
        "errors": len(errors),
        "p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1) if latencies else None,
    }


def _run_threads(target: Any, count: int) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
