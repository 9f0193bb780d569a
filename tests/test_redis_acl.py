"""The least-privilege ACL user of ``deploy/redis/users.acl`` is enough for everything a node
does: a node logged in as that user schedules, runs, retries, dead-letters, replays,
reclaims and serves every API read and write, and Redis's ``ACL LOG`` records no refused
command or key. Also checks ``[redis] password_env``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from actors.admin.calls import ApiError
from actors.admin.client import Client
from tests.api_node import ADMIN, api_node, wait_until, write_api_config
from tests.node_process import REPO

ACL_FILE = REPO / "deploy" / "redis" / "users.acl"
CONSUMERS = """
[consumers.work]
handler = "tests.handlers.jobs:noop"
[consumers.doomed]
handler = "tests.handlers.jobs:hopeless"
max_attempts = 1
[consumers.flaky]
handler = "tests.handlers.jobs:flaky"
max_attempts = 3
backoff_base_s = 0.1
"""


def acl_rule(namespace: str, password: str) -> list[str]:
    """The rule of the shipped ACL file, for this namespace and password."""
    (line,) = [line for line in ACL_FILE.read_text().splitlines() if line.startswith("user ")]
    tokens = line.split()[2:]  # after "user <name>"
    out = []
    for token in tokens:
        if token.startswith(">"):
            token = f">{password}"
        out.append(token.replace("metronome:", f"{namespace}:"))
    return out


def test_a_node_needs_nothing_beyond_the_shipped_acl(
    redis_url: str, db: Any, tmp_path: Path
) -> None:
    namespace = f"acl{time.monotonic_ns() % 10**9}"
    user, password = f"metronome-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    db.execute_command("ACL", "SETUSER", user, *acl_rule(namespace, password))
    db.execute_command("ACL", "LOG", "RESET")
    config = write_api_config(tmp_path / "node.toml", redis_url, namespace, consumers=CONSUMERS)
    text = config.read_text().replace(
        f'url = "{redis_url}"',
        f'url = "{redis_url}"\nusername = "{user}"\npassword_env = "TEST_REDIS_PASSWORD"',
    )
    config.write_text(text)
    now_ms = int(time.time() * 1000)
    with (
        api_node(config, namespace, {"TEST_REDIS_PASSWORD": password}) as api,
        Client(api.url, *ADMIN) as client,
    ):
        client.create_task("work", {"kind": "interval", "every_s": 1}, None, "w")
        client.create_task("doomed", {"kind": "once", "at_ms": now_ms}, None, "d")
        client.create_task("flaky", {"kind": "once", "at_ms": now_ms}, {"succeed_on": 2}, "f")
        client.create_task(
            "nobody", {"kind": "cron", "cron": "0 0 1 1 *"}, None, "n", labels={"team": "ops"}
        )
        wait_until(lambda: client.get_task("w")["runs"] >= 2, 60)
        wait_until(lambda: client.get_task("f")["last_status"] == "ok", 60)
        (dead,) = wait_until(lambda: client.dead_letters("doomed")["dead_letters"], 60)
        assert client.replay("doomed", [dead["entry_id"]])["replayed"] == 1
        wait_until(lambda: client.dead_letters("doomed")["dead_letters"], 60)
        client.trigger("n")
        assert client.explain("n")["summary"]
        assert client.explain("f")["summary"]
        assert {q["type"] for q in client.queues()["queues"]} >= {"work", "nobody"}
        assert client.purge_queue("nobody")["purged"] == 1
        client.update_task("w", payload={"v": 2})
        client.pause("w")
        client.resume("w")
        client.list_tasks()
        assert [t["task_id"] for t in client.list_tasks(labels={"team": "ops"})["tasks"]] == ["n"]
        client.update_task("n", labels={"team": "dev"})
        assert len(client.partitions()["partitions"]) == 16
        client.purge("doomed", None)
        client.delete_task("f")
        with pytest.raises(ApiError) as gone:  # a delete of no such task reads one more record
            client.delete_task("f")
        assert gone.value.status == 404
        assert client.clear_type("work")["deleted"] == 1
        time.sleep(2)  # a claimer round and a retry dispatcher round as this user
        restarts = api.node.events("actor_restarting")
    refused = [e for e in db.execute_command("ACL", "LOG") if _user(e) == user and not _setinfo(e)]
    assert not refused, refused
    assert not restarts, restarts
    db.execute_command("ACL", "DELUSER", user)


def _field(entry: Any, name: str) -> str:
    fields = dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
    value = fields.get(name.encode(), fields.get(name, b""))
    return value.decode() if isinstance(value, bytes) else str(value)


def _user(entry: Any) -> str:
    return _field(entry, "username")


def _setinfo(entry: Any) -> bool:
    """redis-py's CLIENT SETINFO on connect (Redis >= 7.2): refused harmlessly."""
    return _field(entry, "object") == "client|setinfo"
