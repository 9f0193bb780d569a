"""Metronome installed as a user installs it: ``pip install`` into a fresh virtualenv, then a
handler module and a client script that import only the public ``metronome`` package,
run by a node started from that virtualenv (its ``metronome serve``) on a Redis the suite
started. Catches what a test run from the repository cannot: a module or Lua script left
out of the package, a dependency missing from pyproject.toml, a public name that imports
something only the repository has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api_node import ADMIN, api_node, wait_until, write_api_config
from tests.node_process import REPO

pytestmark = pytest.mark.slow  # a pip install from the package index: CI's `pytest -m slow`

#: What the package is built from (pyproject.toml's packages and readme).
SOURCES = ("pyproject.toml", "README.md", "metronome", "runtime", "actors")

HANDLERS = '''
"""A user's handler module: it knows only the public package."""
import os

import metronome
from metronome import HandlerContext


async def record(ctx: HandlerContext) -> dict:
    with open(os.environ["FRESH_RECORD"], "a") as out:
        out.write(f"{ctx.task_id} {ctx.attempt} {ctx.payload['greeting']} {metronome.__file__}\\n")
    return {"recorded": True}
'''

CLIENT = '''
"""A user's client script: it knows only the public package."""
import sys

import metronome
from metronome import Client

url, key_id, secret = sys.argv[1:4]
with Client(url, key_id, secret) as api:
    created = api.create_task(
        "fresh", {"kind": "interval", "every_s": 1}, payload={"greeting": "hello"},
        task_id="fresh-install",
    )
print(metronome.__file__)
print(created["task_id"])
'''


def _plain_env() -> dict[str, str]:
    """The environment without a path to the repository: the virtualenv's own packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with Metronome installed from a copy of the repository's sources
    (built there, so the repository is left as it is)."""
    root = tmp_path_factory.mktemp("fresh")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
        else:
            shutil.copy2(REPO / name, source / name)
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, env=_plain_env())
    installed = subprocess.run(
        [str(env / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         str(source)],
        capture_output=True, text=True, env=_plain_env(), cwd=root, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    return env


def test_a_fresh_install_runs_a_users_handler_for_a_users_client(
    venv: Path, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "fresh_handlers.py").write_text(HANDLERS)
    (app / "client.py").write_text(CLIENT)
    record = tmp_path / "fires.txt"
    config = write_api_config(
        app / "node.toml", redis_url, namespace,
        consumers='[consumers.fresh]\nhandler = "fresh_handlers:record"\n',
    )  # fmt: skip
    # As a user runs it: the handler module next to node.toml, started from that folder.
    launcher = (str(venv / "bin" / "metronome"), "serve")
    with api_node(
        config, namespace, {"FRESH_RECORD": str(record)}, launcher=launcher, cwd=app
    ) as api:
        client = subprocess.run(
            [str(venv / "bin" / "python"), str(app / "client.py"), api.url, *ADMIN],
            capture_output=True, text=True, env=_plain_env(), cwd=app, timeout=60,
        )  # fmt: skip
        assert client.returncode == 0, client.stderr
        imported_from, task_id = client.stdout.split()
        assert Path(imported_from).is_relative_to(venv)  # the installed package, not the repo
        assert task_id == "fresh-install"
        wait_until(lambda: record.exists() and record.read_text(), 30)
        fired, attempt, greeting, node_imported_from = record.read_text().splitlines()[0].split()
        assert (fired, attempt, greeting) == ("fresh-install", "0", "hello")
        assert Path(node_imported_from).is_relative_to(venv)  # the node ran the install too
