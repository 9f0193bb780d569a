"""Each benchmark mode at tiny scale, as a real command: the JSON shape holds and work
was done. Figures are not checked here (performance claims come from full runs)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node_process import REPO

#: Benchmarks that run at once, over all the xdist workers of a run: each drives nodes flat
#: out, and more at once on a small machine starve each other of the work they count.
SLOTS = 2


@pytest.fixture(autouse=True)
def bench_slot(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[None]:
    """One of ``SLOTS`` for the test (a lock file in the run's temp root, which its
    workers share), waited for as long as it takes."""
    if worker_id == "master":  # no xdist: one test at a time anyway
        yield
        return
    root = tmp_path_factory.getbasetemp().parent
    while True:
        for slot in range(SLOTS):
            fd = os.open(root / f"bench-slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
                return
            finally:
                os.close(fd)  # the lock goes with it
        time.sleep(0.1)


def bench(*args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True, text=True, cwd=REPO, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, f"one JSON line expected, got {len(lines)}: {lines[:3]}"
    figures: dict[str, Any] = json.loads(lines[0])
    return figures


@pytest.mark.parametrize("processes", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_fire_mode_reports_every_figure(processes: int) -> None:
    """With child processes, handlers that wait (``--wait-ms``) too."""
    waits = ["--wait-ms", "2"] if processes else []
    figures = bench("fire", "60", "1", "4", "--processes", str(processes), *waits)
    assert figures["processes"] == processes
    assert figures.get("wait_ms") == (2.0 if processes else None)
    assert set(figures) >= {
        "n", "interval_s", "duration_s", "nodes", "register_s", "expected", "executed",
        "exec_per_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "missed", "duplicates",
        "redis_bytes_per_task", "node_cpu_pct", "redis_cpu_us_per_fire",
        "redis_sys_cpu_us_per_fire", "redis_cpu_pct_per_shard", "node_cpu_us_per_fire",
        "process_cpu_pct",
    }  # fmt: skip
    assert figures["executed"] > 0
    assert figures["expected"] > 0
    assert "node-0" in figures["process_cpu_pct"]
    if processes:
        assert "node-0/scheduler" in figures["process_cpu_pct"]


@pytest.mark.slow
def test_fire_mode_on_a_local_redis_cluster() -> None:
    """Tasks over three types (three streams, three slots), as the scale-out series runs."""
    figures = bench("fire", "60", "1", "4", "--cluster", "3", "--scrape", "1", "--types", "3")
    assert figures["shards"] == 3 and len(figures["redis_cpu_pct_per_shard"]) == 3
    assert figures["types"] == 3
    assert figures["executed"] > 0
    assert figures["scrapes"]["count"] > 0 and figures["scrapes"]["failures"] == 0


@pytest.mark.slow
def test_scrape_mode() -> None:
    figures = bench("scrape", "500", "5")
    assert figures["scrapes"] == 5 and figures["status_counts"]["active"] == 500


@pytest.mark.slow
def test_fire_mode_with_chaos_kills_a_child_process() -> None:
    figures = bench("fire", "200", "1", "16", "--processes", "1", "--chaos", "2", "--flaky")
    assert (figures["chaos_every_s"], figures["kills"]) == (2.0, 1)
    assert figures["executed"] > 0
    assert figures["failed_first"] > 0 and "retries_lost" in figures


def test_chaos_needs_child_processes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "fire", "10", "1", "4", "--chaos", "2"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--chaos kills a node's child processes: it needs --processes" in result.stderr


@pytest.mark.slow
def test_reclaim_mode() -> None:
    figures = bench("reclaim", "2", "1")
    assert figures["reclaimed"] == 2
    assert figures["reclaim_max_ms"] > 0


def test_idle_mode() -> None:
    figures = bench("idle", "200", "1")
    assert figures["n"] == 200
    assert figures["redis_bytes_per_task"] > 0
    assert figures["node_cpu_pct"] >= 0
    for read in ("ls_first_page_ms", "ls_type_page_ms", "ls_no_match_call_ms", "get_ms",
                 "explain_ms"):  # fmt: skip
        assert 0 < figures[read]["p50"] <= figures[read]["max"], read
    assert figures["count_by_status_s"] >= 0


@pytest.mark.parametrize(("mode", "args"), [("schedule", ["500", "50", "2"]), ("hop", ["200"])])
def test_scheduling_and_hop_modes(mode: str, args: list[str]) -> None:
    figures = bench(mode, *args)
    assert figures["mode"] == mode
    if mode == "schedule":
        assert figures["bulk_create_per_s"] > 0
        assert figures["sustained_fires"] > 0
    else:
        assert figures["layer_us_per_call"] > 0


@pytest.mark.parametrize("processes", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_api_mode(processes: int) -> None:
    figures = bench("api", "--rate", "20", "--seconds", "2", "--bulk-total", "1000",
                    "--bulk-size", "500", "--workers", "2",
                    "--processes", str(processes))  # fmt: skip
    assert figures["api_processes"] == processes
    assert figures["bulk"]["tasks_per_s"] > 0
    assert figures["single_max"]["creates_per_s"] > 0
    assert figures["single_steady"]["requests"] == 40
    assert figures["single_steady"]["errors"] == 0
    assert figures["healthz_max"]["requests_per_s"] > 0


@pytest.mark.slow
def test_layout_mode() -> None:
    figures = bench("layout", "300")
    # 300 tasks spread over 16 x 1024 default buckets cost more than layout 1; sized, less
    assert figures["layout_1"] > figures["layout_2_sized"] > 0
    assert figures["layout_2_after_a_run"] > 0 and figures["layout_2"] > 0
    only = bench("layout", "300", "--only", "layout_2_sized")
    assert only.keys() - {"mode", "n", "sized_buckets"} == {"layout_2_sized"}


def test_scripts_mode() -> None:
    figures = bench("scripts", "300", "10")
    for script in ("claim", "enqueue", "commit", "read", "ack", "outcome"):
        assert figures["scripts"][script]["calls"] > 0
        assert figures["scripts"][script]["us_per_task"] > 0
    assert set(figures["pieces"]) >= {"hget_us", "unpack_us", "pack_us", "zadd_us"}


def test_drain_mode() -> None:
    figures = bench("drain", "3000")
    assert figures["messages"] == 3000 and 0 < figures["timed"] <= 3000
    assert figures["per_s"] > 0
    assert figures["cpu_us_per_message"]["node-0/consumers-1"] > 0
    lines = (Path(figures["workdir"]) / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3000  # every message ran, once
    assert len({json.loads(line)["task_id"] for line in lines}) == 3000
