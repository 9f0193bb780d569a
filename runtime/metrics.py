"""Prometheus metrics for a node and its child processes, with ``prometheus-client``.

A node may run parts in child processes (``[processes]``), each counting what it does;
``/metrics`` must show the node's totals whoever serves it. That is prometheus-client's
multiprocess mode: every process of the node writes its samples to memory-mapped files in
one directory (``PROMETHEUS_MULTIPROC_DIR``) and the serving process sums them. The main
process makes a fresh directory before anything imports prometheus-client (it picks its
storage at import time) and hands it to its children through the environment; the
directory goes when the node stops. Files of children that died stay: their counters
remain part of the node's totals, as counters must.

In a process that never called ``enable_multiprocess`` (a test, a script) metrics live in
the default in-memory registry and ``exposition`` reads that.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Set by the main process that made the directory: only it removes it.
_OWNER_ENV = "METRONOME_METRICS_DIR_OWNER"


def enable_multiprocess() -> str:
    """In a node's main process, before prometheus-client is imported: a fresh directory
    for every process of this node (children inherit it), removed at exit. A child
    process finds it set already and keeps it."""
    existing = os.environ.get(ENV)
    if existing and os.environ.get(_OWNER_ENV) != str(os.getpid()):
        return existing  # a child of the node, or set by the operator
    path = tempfile.mkdtemp(prefix="metronome-metrics-")
    os.environ[ENV] = path
    os.environ[_OWNER_ENV] = str(os.getpid())
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def exposition(collectors: Iterable[Any] = ()) -> tuple[bytes, str]:
    """The text exposition of this node's metrics, plus ``collectors`` (objects with a
    ``collect()``, e.g. gauges read from Redis at scrape time); (body, content type)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(ENV):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Delegate(REGISTRY))  # this process's own metrics
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Delegate:
    """Another registry's metrics, as one collector."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()  # type: ignore[no-any-return]
