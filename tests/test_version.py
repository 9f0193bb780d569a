"""The release version is defined once (``runtime/version.py``) and everything shows that
one: the package metadata, ``metronome --version``, ``python -m runtime --version``, the
CHANGELOG and the image tag of the Kubernetes manifests.
(``/healthz``, ``/readyz`` and the ``node_started`` line are checked with the nodes of test_api.py
and test_node_process.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from runtime.version import __version__
from tests.node_process import REPO

METRONOME = Path(sys.executable).parent / "metronome"


def no_credentials() -> dict[str, str]:
    """An environment with no API settings: the version needs neither a node nor a key."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("METRONOME_")}
    return {**environment, "PYTHONPATH": str(REPO)}


def test_the_version_is_a_semantic_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_pyproject_reads_the_version_from_the_module() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    attr = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert (module, name) == ("runtime.version", "__version__")


def test_the_changelog_names_this_release() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"\n## [{__version__}] - " in changelog


@pytest.mark.parametrize(
    "command",
    [
        pytest.param([str(METRONOME)], id="metronome"),
        pytest.param([sys.executable, "-m", "actors.admin.cli"], id="python-m-actors.admin.cli"),
        pytest.param([sys.executable, "-m", "runtime"], id="python-m-runtime"),
    ],
)
def test_version_flag_prints_the_version(command: list[str], tmp_path: Path) -> None:
    if not Path(command[0]).exists():
        pytest.skip("the metronome console script is not installed (pip install -e .)")
    done = subprocess.run([*command, "--version"], capture_output=True, text=True,
                          cwd=tmp_path, env=no_credentials(), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"metronome {__version__}\n"


def test_the_kubernetes_manifests_run_this_release() -> None:
    tags = {
        line.split("image: metronome:", 1)[1].strip()
        for path in (REPO / "deploy" / "k8s").glob("*.yaml")
        for line in path.read_text().splitlines()
        if "image: metronome:" in line
    }
    assert tags == {__version__}
