"""A real node process serving the API, for the API, client and CLI tests.

The node binds port 0 and logs ``api_listening`` with its URL; tests talk to it with the
signing client (``actors.admin.client``) or the CLI, and check Redis with a plain redis-py
client on the same server.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.node_process import REPO, NodeProcess
from tests.waiting import until

#: Consumer sections most API node tests need: a type that succeeds, one that always fails
#: at once (its fires go straight to the dead-letter queue).
WORK_AND_DOOMED = """
[consumers.work]
handler = "tests.handlers.jobs:noop"
[consumers.doomed]
handler = "tests.handlers.jobs:hopeless"
max_attempts = 1
"""
ADMIN = ("admin", "admin-secret-0123456789")
READER = ("reader", "reader-secret-0123456789")


@attrs.frozen
class ApiNode:
    url: str
    namespace: str
    node: NodeProcess


def cli_environment(api: ApiNode, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``metronome`` call against ``api``'s node as its admin (and the
    repository on PYTHONPATH: the test handlers the node config names), plus ``env``."""
    return {
        **os.environ,
        "METRONOME_URL": api.url,
        "METRONOME_KEY_ID": ADMIN[0],
        "METRONOME_SECRET": ADMIN[1],
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }


def write_api_config(
    path: Path,
    redis_url: str,
    namespace: str,
    *,
    consumers: str = "",
    api_extra: str = "",
) -> Path:
    path.write_text(
        f"""
namespace = "{namespace}"
[node]
name = "api-node"
shutdown_grace_s = 5
[redis]
url = "{redis_url}"
[scheduler]
max_tick_s = 0.05
[execution]
results_log = "{path.parent / "results.jsonl"}"
{consumers}
[api]
bind = "127.0.0.1:0"
{api_extra}
[[api.keys]]
id = "{ADMIN[0]}"
secret = "{ADMIN[1]}"
[[api.keys]]
id = "{READER[0]}"
secret_env = "TEST_READER_SECRET"
read_only = true
"""
    )
    return path


@contextlib.contextmanager
def plain_api_node(redis_url: str, workdir: Path, prefix: str) -> Iterator[ApiNode]:
    """``api_node`` with the default config (``write_api_config``) in a namespace of its
    own (``prefix`` and a number): a test module's shared node."""
    namespace = f"{prefix}{time.monotonic_ns() % 10**9}"
    config = write_api_config(workdir / "node.toml", redis_url, namespace)
    with api_node(config, namespace) as node:
        yield node


@contextlib.contextmanager
def recording_api_node(
    redis_url: str, workdir: Path, prefix: str, record_file: Path, *, consumers: str,
    api_extra: str = "",
) -> Iterator[ApiNode]:  # fmt: skip
    """``api_node`` in a namespace of its own (``prefix`` and a number), running
    ``consumers`` whose test handlers record each call in ``record_file``: a test module's
    shared node that runs fires."""
    namespace = f"{prefix}{time.monotonic_ns() % 10**9}"
    config = write_api_config(
        workdir / "node.toml", redis_url, namespace, consumers=consumers, api_extra=api_extra
    )
    with api_node(config, namespace, {"METRONOME_TEST_RECORD": str(record_file)}) as node:
        yield node


@contextlib.contextmanager
def api_node(
    config: Path,
    namespace: str,
    env: dict[str, str] | None = None,
    pythonpath: tuple[Path, ...] = (),
    launcher: tuple[str, ...] = (),
    cwd: Path | None = None,
) -> Iterator[ApiNode]:
    """Run the node (with the reader key's secret and ``env`` in its environment, and
    ``pythonpath`` after the repository on its import path; ``launcher`` and ``cwd``: see
    ``NodeProcess``), and
    afterwards fail if it answered any request with a 500: every 500 is a bug, and the
    node logs it as ``api_error`` with its traceback."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"TEST_READER_SECRET": READER[1], **(env or {})}.items():
            patch.setenv(name, value)
        node = NodeProcess(config, pythonpath=pythonpath, launcher=launcher, cwd=cwd)  # env now
    try:
        (listening,) = node.wait_for("api_listening")
        yield ApiNode(listening["urls"][0], namespace, node)
        errors = [e.get("exception", e) for e in node.events("api_error")]
        assert not errors, "\n".join(map(str, errors))
    finally:
        node.signal()
        try:
            node.wait(15)
        finally:
            node.kill()


def unique(prefix: str) -> str:
    """A task id (or type) no other test uses."""
    return f"{prefix}-{time.monotonic_ns()}"


def wait_until(predicate: Any, timeout_s: float = 15.0) -> Any:
    """Poll ``predicate`` (typically a request to the node) until it returns something
    true; return that, or fail."""
    return until(predicate, timeout_s, poll_s=0.05)
