"""Small versions of every ``python -m bench chaos`` scenario: real faults, real node
processes, counted from what the handlers recorded. Opt in with ``pytest -m chaos`` (CI
runs them as a step of their own); the full-size runs and their figures are in
docs/RELIABILITY.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

SMALL = ["--n", "200", "--interval-s", "1", "--duration-s", "28", "--nodes", "2"]


def chaos(scenario: str, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", scenario, *SMALL, *args],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


@pytest.mark.chaos
@pytest.mark.parametrize(
    ("scenario", "args"),
    [
        ("redis-restart", ["--fault-s", "3"]),
        ("redis-stall", ["--fault-s", "3"]),
        ("sentinel-failover", []),
        ("endpoint-failover", []),
        ("cluster-failover", []),
        ("cluster-kill", ["--fault-s", "3"]),
        ("kill-nodes", ["--every-s", "5"]),
        ("kill-children", ["--every-s", "4"]),
        ("flaky", []),
        ("redis-busy", ["--fault-s", "4"]),
        ("redis-oom", ["--fault-s", "4"]),
        ("poison-kill", []),
        ("stream-rejected", ["--fault-s", "5"]),
        ("partition-rejected", ["--fault-s", "5"]),
        ("outcomes-rejected", ["--fault-s", "5"]),
        ("dlq-rejected", ["--fault-s", "5"]),
        ("results-log-failing", ["--fault-s", "5"]),
        ("retry-unreadable", ["--fault-s", "5"]),
        ("poison-ends-rejected", ["--fault-s", "3"]),
    ],
)
def test_nothing_is_lost_under(scenario: str, args: list[str]) -> None:
    figures = chaos(scenario, *args)
    assert figures["expected"] > 1000
    assert figures["missed"] == 0, figures
    assert figures["duplicates_unexplained"] == 0, figures
    assert figures["node_exits"] == 0, figures
    assert figures["tasks_after"] == figures["tasks_before"] == 200
    if scenario != "flaky":
        assert figures["faults"] >= 1, figures
    if scenario in ("flaky", "redis-oom", "retry-unreadable"):
        assert figures["failed_first"] > 0 and figures["retries_lost"] == 0, figures
    if scenario == "retry-unreadable":  # each bad context named and kept, none run
        planted = figures["unreadable_planted"]
        assert figures["unreadable_kept"] == planted > 0, figures
        assert figures["retry_unreadable"] >= planted, figures
    if scenario == "poison-ends-rejected":  # the killer held back, then dead-lettered,
        assert figures["poison_held"] >= 1, figures  # the claimers' rounds never refused
        assert figures["redis_refused"] == 0, figures
    if scenario in ("poison-kill", "poison-ends-rejected"):  # the killer alone, not the
        # fires read with it
        assert figures["actor_crashes"] >= 1, figures
        assert figures["dead_letters"] == 1, figures
        assert figures["dead_letters_not_the_killer"] == 0, figures
    if scenario == "stream-rejected":  # the other type fired while one stream was broken
        assert figures["ran_during_faults"] > 100, figures
        assert figures["actor_crashes"] == 0, figures
        # No kill, but the fault is as long as the message lease (renewals and acks of the
        # broken stream wait too): a message whose lease ran out may be taken over and run
        # again, as after a pause longer than the lease. Any other duplicate is a bug.
        assert figures["duplicates"] <= figures["reclaimed"], figures
    if scenario in ("partition-rejected", "outcomes-rejected"):  # the others fired meanwhile
        assert figures["ran_during_faults"] > 500, figures
    if scenario == "dlq-rejected":  # each dead letter written once the key was back ...
        assert figures["dead_letters"] == figures["dead_letters_expected"] > 0, figures
        # ... and while it was not, the two doomed tasks' partitions alone were held back
        # (of 16): the other fires of the fault were acknowledged, not left pending.
        assert figures["pending_at_fault_end"] < figures["ran_during_faults"] / 2, figures
    if scenario in (
        "redis-busy", "redis-oom", "partition-rejected", "outcomes-rejected", "dlq-rejected",
        "results-log-failing", "retry-unreadable",
    ):  # fmt: skip
        assert figures["duplicates"] == 0, figures  # no kill: a duplicate is a bug
        assert figures["actor_crashes"] == 0, figures


@pytest.mark.chaos
def test_live_busy_consumers_keep_their_messages_through_a_pause_longer_than_the_lease() -> None:
    """15 s handlers, lease_s 6, an 8 s CLIENT PAUSE: no message is reclaimed from a live
    consumer, so no fire starts twice (no kill here: a duplicate is a bug)."""
    figures = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", "long-handler", "--n", "100", "--interval-s",
         "2", "--duration-s", "45", "--nodes", "3", "--fault-s", "8", "--hold-s", "15"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert figures.returncode == 0, figures.stderr[-2000:]
    result = json.loads(figures.stdout.strip().splitlines()[-1])
    assert result["expected"] > 1000, result
    assert result["missed"] == 0, result
    assert result["duplicates"] == 0, result
    assert result["reclaimed"] == 0, result
    assert result["node_exits"] == 0, result
