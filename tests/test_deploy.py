"""The files in ``deploy/`` work as shipped: every node config passes ``--check``, the
Kubernetes manifests are valid for the API version they target (kubernetes-validate,
strict), every stop grace the orchestrators give is longer than the node's own drain, and
the wheel the Dockerfile installs carries everything a node needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.node_process import REPO

DEPLOY = REPO / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
ENV = {"METRONOME_SECRET": "s" * 32, "METRONOME_REDIS_PASSWORD": "p" * 16}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _configmap_files() -> dict[str, str]:
    (configmap,) = _documents(DEPLOY / "k8s" / "configmap.yaml")
    return dict(configmap["data"])


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "--check", str(path)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, **ENV}, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "config", [*DEPLOY.glob("*.toml"), *DEPLOY.glob("docker/*.toml")], ids=lambda p: p.name
)
def test_every_shipped_node_config_passes_check(config: Path) -> None:
    done = _check(config)
    assert done.returncode == 0, done.stderr


def test_the_configmap_node_configs_pass_check(tmp_path: Path) -> None:
    for name, text in _configmap_files().items():
        (tmp_path / name).write_text(text)
        done = _check(tmp_path / name)
        assert done.returncode == 0, (name, done.stderr)


def test_kubernetes_manifests_are_valid_in_strict_mode() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "-k", "1.29.0",
         *map(str, K8S)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("passed") >= len(K8S)


def _grace(toml_text: str) -> float:
    return float(tomllib.loads(toml_text).get("node", {}).get("shutdown_grace_s", 10.0))


def test_orchestrators_wait_longer_than_the_node_drains() -> None:
    configs = _configmap_files()
    for path in K8S:
        for doc in _documents(path):
            if doc["kind"] != "Deployment":
                continue
            pod = doc["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            config = Path(container["args"][0]).name
            # the drain within the grace, then the last flush and release within another
            assert pod["terminationGracePeriodSeconds"] > 2 * _grace(configs[config]), path
            probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
            assert probes == {"/healthz", "/readyz"}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if name == "redis":
            assert "--appendonly" in service["command"]
            continue
        node_toml = DEPLOY / "docker" / Path(service["command"][0]).name
        grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
        assert grace is not None and int(grace[1]) > 2 * _grace(node_toml.read_text()), name


def test_the_wheel_carries_the_lua_scripts_and_every_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "--wheel-dir", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    lua = {Path(n).name for n in names if n.startswith("actors/store/lua/")}
    assert lua == {p.name for p in (REPO / "actors/store/lua").glob("*.lua")}
    for package in ("actors/admin", "actors/api", "actors/execution", "actors/scheduling",
                    "runtime", "metronome"):  # fmt: skip
        assert f"{package}/__init__.py" in names
    assert "metronome/py.typed" in names  # handler authors' mypy reads its types


def test_the_image_builds_its_wheel_from_every_package_pyproject_names() -> None:
    """The Dockerfile copies each top-level package of ``[tool.setuptools] packages`` (and
    the readme) into its build stage: one left out fails the image's ``pip wheel``."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    tops = {name.split(".")[0] for name in packages["packages"]}
    copied = set(re.findall(r"^COPY (\S+) \1$", (REPO / "deploy/Dockerfile").read_text(), re.M))
    assert tops <= copied
