"""How an xdist run (``--dist loadgroup``) hands tests to its workers.

The tests of a module that share something it starts (a node, Chromium, a cluster) go to
one worker together, or each worker that got one of them would start its own; a module
whose tests take long together is cut in consecutive parts, each on one worker. Work goes
out longest first, by what each test took in earlier runs (kept in pytest's cache): a long
test handed out last would keep the run going while the other workers sit idle. Without
earlier runs (a fresh checkout, CI), the durations in ``tests/durations.json`` stand in
(refresh it with ``python -m tests.run_order`` after a full run); a test in neither counts
as ``UNKNOWN_S``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

#: Fixtures that start something for a whole module (a node, Chromium) or for a worker's
#: session (a cluster).
SHARED_PER_MODULE = frozenset({"api", "browser", "cluster_url", "with_token", "elsewhere", "venv"})
#: Where the durations are kept in pytest's cache.
CACHE_KEY = "metronome/durations"
#: What a test no earlier run timed counts as.
UNKNOWN_S = 3.0
#: What the tests took in a full run on a 2-core machine: the order of a run without a cache.
SEED = Path(__file__).with_name("durations.json")
#: A module sharing a node is cut in parts of about this long, each on a worker with a
#: node of its own: one part of minutes would keep the run going alone at its end.
PART_S = 30.0


class Durations:
    """In the process that hands tests out (the xdist controller): tells each worker what
    the tests took before, and keeps what they take in this run."""

    def __init__(self, cache: pytest.Cache) -> None:
        self.cache = cache
        self.before: dict[str, float] = cache.get(CACHE_KEY, {}) or seed()
        self.now: dict[str, float] = defaultdict(float)
        self.skipped: set[str] = set()
        """Tests skipped in this run (no browser, say): what they took says nothing."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Each worker orders its collection by the same durations, read once here: a
        collection that differs between workers would stop the run."""
        node.workerinput[CACHE_KEY] = self.before

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.now[_plain(report.nodeid)] += report.duration  # setup, call and teardown
        if report.skipped:
            self.skipped.add(_plain(report.nodeid))

    def pytest_sessionfinish(self) -> None:
        ran = {k: round(v, 3) for k, v in self.now.items() if k not in self.skipped}
        if ran:
            self.cache.set(CACHE_KEY, {**self.before, **ran})


def plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: mark the groups, then put the longest work first (a stable sort:
    a group's tests stay together and in their order)."""
    before: dict[str, float] = getattr(config, "workerinput", {}).get(CACHE_KEY) or seed()
    took = {item.nodeid: before.get(item.nodeid, UNKNOWN_S) for item in items}
    shared: dict[Path, list[pytest.Item]] = defaultdict(list)
    for item in items:
        if SHARED_PER_MODULE & set(getattr(item, "fixturenames", ())):
            shared[item.path].append(item)
    for path, module in shared.items():
        parts = max(1, round(sum(took[item.nodeid] for item in module) / PART_S))
        for item, part in zip(module, _cut(module, parts, took), strict=True):
            item.add_marker(pytest.mark.xdist_group(f"{path.stem}-{part}"))
    weight: dict[str, float] = defaultdict(float)
    for item in items:
        weight[_unit(item)] += took[item.nodeid]
    items.sort(key=lambda item: -weight[_unit(item)])


def seed() -> dict[str, float]:
    """The durations ``tests/durations.json`` holds (none if it is missing)."""
    try:
        durations: dict[str, float] = json.loads(SEED.read_text())
    except FileNotFoundError:
        return {}
    return durations


def refresh_seed(cache_dir: Path) -> int:
    """Write the last runs' durations (pytest's cache in ``cache_dir``) to the seed, each to
    a tenth of a second; the number of tests written."""
    kept = json.loads((cache_dir / "v" / CACHE_KEY).read_text())
    SEED.write_text(json.dumps({k: round(v, 1) for k, v in sorted(kept.items())}, indent=0) + "\n")
    return len(kept)


def check_tools(config: pytest.Config) -> None:
    """Refuse a pytest and pytest-xdist known not to group under ``--dist loadgroup``: each
    test of a shared module would start its own node and browser on whichever worker it
    landed, a much slower run with nothing to say why. pytest 9.2 keeps node ids where
    pytest-xdist 3.8 cannot append a group to them."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    pytest_release = _release(metadata.version("pytest"))
    xdist_release = _release(metadata.version("pytest-xdist"))
    if pytest_release >= (9, 2) and xdist_release < (3, 9):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {'.'.join(map(str, xdist_release))} "
            "does not group tests under --dist loadgroup: install the test extra's pytest "
            "(pip install -e '.[test]')"
        )


def _release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string, a pre- or post-release counting as its release."""
    return Version(version).release[:2]


def _cut(module: list[pytest.Item], parts: int, took: dict[str, float]) -> list[int]:
    """Which of ``parts`` consecutive parts of about equal duration each test falls in."""
    total = sum(took[item.nodeid] for item in module)
    if total <= 0:  # nothing known of them: one part
        return [0] * len(module)
    before = 0.0
    out = []
    for item in module:
        out.append(min(parts - 1, int(before / total * parts)))
        before += took[item.nodeid]
    return out


def _unit(item: pytest.Item) -> str:
    """What xdist hands out whole: the test's group, or the test alone."""
    group = item.get_closest_marker("xdist_group")
    return f"@{group.args[0]}" if group else item.nodeid


def _plain(nodeid: str) -> str:
    """A test's id without the group xdist appends to it (``id@group``)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


if __name__ == "__main__":
    print(f"{refresh_seed(Path('.pytest_cache'))} durations written to {SEED}")
