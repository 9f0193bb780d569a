"""The public import surface: ``metronome``'s names, the deprecated paths that still lead
to them, and a handler and a client script that know nothing but ``metronome``."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import metronome
from tests.api_node import ADMIN, api_node, wait_until, write_api_config
from tests.node_process import REPO

#: Removing a name from this set is a breaking change: deprecate it for a release first.
PUBLIC = {
    "ApiError",
    "ApiUnavailable",
    "AsyncClient",
    "Client",
    "HandlerContext",
    "InvalidTask",
    "InvalidTransition",
    "LayoutMismatch",
    "RedisClient",
    "RedisSection",
    "RetryLater",
    "Schedule",
    "Task",
    "TaskConflict",
    "TaskError",
    "TaskNotFound",
    "TaskSpec",
    "TaskStore",
    "Unrecoverable",
    "configure_logging",
}

#: Deprecated module -> (the names it still offers, the new import its warning names).
DEPRECATED_MODULES = {
    "actors.handlers": (
        ("HandlerContext", "RetryLater", "Unrecoverable"),
        "from metronome import HandlerContext",
    ),
    "actors.client": (
        ("Client", "AsyncClient", "ApiError", "ApiUnavailable"),
        "from metronome import Client",
    ),
    "actors.model": (("TaskSpec", "Task"), "from metronome import TaskSpec, Task"),
    "actors.schedules": (("Schedule",), "from metronome import Schedule"),
}


def test_public_names_are_pinned() -> None:
    assert set(metronome.__all__) == PUBLIC
    assert len(metronome.__all__) == len(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_resolves_and_is_documented(name: str) -> None:
    value = getattr(metronome, name)
    assert value is not None
    assert name in dir(metronome)
    assert metronome.__doc__ is not None
    assert f"``{name}``" in metronome.__doc__, f"{name} missing from metronome's docstring"


def test_public_names_are_the_internal_objects() -> None:
    from actors.admin.client import Client
    from actors.execution.handlers import HandlerContext
    from actors.store.tasks import TaskStore

    assert metronome.Client is Client
    assert metronome.HandlerContext is HandlerContext
    assert metronome.TaskStore is TaskStore


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        _ = metronome.Clinet  # type: ignore[attr-defined]


def test_importing_metronome_for_a_handler_does_not_load_the_http_client() -> None:
    code = (
        "import sys\n"
        "from metronome import HandlerContext, RetryLater, Unrecoverable\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'httpx', 'hypercorn'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", sorted(DEPRECATED_MODULES))
def test_deprecated_module_warns_naming_the_new_import(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    names, new_import = DEPRECATED_MODULES[module]
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(new_import)):
        old = importlib.import_module(module)
    for name in names:
        assert getattr(old, name) is getattr(metronome, name)


def test_deprecated_store_attribute_warns_naming_the_new_import() -> None:
    with pytest.warns(DeprecationWarning, match=re.escape("from metronome import TaskStore")):
        from actors.store import TaskStore  # type: ignore[attr-defined]
    assert TaskStore is metronome.TaskStore
    with pytest.raises(AttributeError):
        _ = importlib.import_module("actors.store").NoSuchThing


def test_nothing_in_the_code_base_uses_a_deprecated_path() -> None:
    """The shims are for users; the project itself imports the new places (and its docs'
    examples show them), so the suite never warns. Prose may still name the old paths."""
    old = re.compile(
        r"^\s*(from|import) actors\.(handlers|client|model|schedules)\b"  # an import
        r"|^\s*from actors\.store import .*\bTaskStore\b"
        r"|[\"']actors\.(handlers|client|model|schedules):"  # a handler named in node.toml
        r"|\bactors\.store\.TaskStore\("  # a use of the old attribute
    )
    shims = ("handlers.py", "client.py", "model.py", "schedules.py", "store/__init__.py")
    skip = {*(REPO / "actors" / shim for shim in shims), Path(__file__), REPO / "CHANGELOG.md"}
    found = []
    for pattern in ("**/*.py", "**/*.md", "**/*.toml"):
        for path in REPO.glob(pattern):
            if path in skip or any(part.startswith(".") for part in path.parts):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if old.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


HANDLER = '''
"""A handler module that knows Metronome only by its public surface."""

import json
from pathlib import Path

from metronome import HandlerContext, RetryLater


def run(ctx: HandlerContext) -> dict:
    with Path(ctx.payload["record"]).open("a") as out:
        out.write(json.dumps({"task_id": ctx.task_id, "attempt": ctx.attempt}) + "\\n")
    if ctx.attempt == 0:
        raise RetryLater(0.1, "once more")
    return {"ran": ctx.task_id}
'''

SCRIPT = '''
"""A client script that knows Metronome only by its public surface."""

import sys

from metronome import ApiError, Client

url, key_id, secret, record = sys.argv[1:]
with Client(url, key_id, secret) as api:
    api.create_task(
        "public",
        {"kind": "interval", "every_s": 3600},
        payload={"record": record},
        task_id="public-surface",
    )
    try:
        api.get_task("no-such-task")
    except ApiError as exc:
        print(exc.code)
'''


def test_a_handler_and_a_script_on_the_public_surface_run_against_a_node(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "mymod.py").write_text(textwrap.dedent(HANDLER))
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    record = tmp_path / "record.jsonl"
    config = write_api_config(
        tmp_path / "node.toml",
        redis_url,
        namespace,
        consumers='[consumers.public]\nhandler = "mymod:run"\n',
    )
    with api_node(config, namespace, pythonpath=(handlers,)) as node:
        done = subprocess.run(
            [sys.executable, str(script), node.url, *ADMIN, str(record)],
            env={"PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "not_found"

        def runs() -> list[dict[str, object]]:
            if not record.exists():
                return []
            lines = [json.loads(line) for line in record.read_text().splitlines()]
            return lines if len(lines) >= 2 else []

        assert wait_until(runs, 30) == [
            {"task_id": "public-surface", "attempt": 0},
            {"task_id": "public-surface", "attempt": 1},
        ]
