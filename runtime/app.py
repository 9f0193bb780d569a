"""How the runtime finds the application it runs.

``[node] app`` names a module (default ``actors.app``) that defines:

- ``Config``: an attrs class for the whole node.toml, with ``node: NodeSection`` and
  ``log: LogSection`` fields (and whatever else the application needs);
- ``build_tree(config, invocation) -> ChildSpec``: the root supervisor of the node, or of
  the part of it named by ``invocation.part`` when the node runs parts of itself in child
  processes (``runtime.process``).

This keeps ``runtime`` free of any knowledge of tasks, and lets tests run the real
``python -m runtime`` with a tiny application of their own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from runtime.config import LogSection, NodeSection, load_toml, structure
from runtime.errors import ConfigError
from runtime.supervisor import ChildSpec

DEFAULT_APP = "actors.app"


@attrs.frozen
class Invocation:
    """How this process was started: what ``build_tree`` needs beyond the config."""

    config_path: Path
    """The node's config file, resolved: child processes are started with the same one."""
    part: str | None = None
    """``--part NAME``: this process is a child of a node and runs only part ``NAME``."""
    check: bool = False
    """``--check``: the tree is built to be checked, never run: nothing is locked or
    written (a node may be running on the same files, and a check run as another user
    would leave them that user's)."""
    config_digest: str = ""
    """The digest of the config file as this node read it (``LoadedApp.digest``): its
    child processes are started with it, and refuse a file changed since (a part would
    run another namespace, Redis or handlers than the rest of its node)."""


@attrs.frozen
class LoadedApp:
    config: Any
    node: NodeSection
    log: LogSection
    build_tree: Callable[[Any, Invocation], ChildSpec]
    digest: str = ""
    """A digest of the config file's bytes as read."""


def load_app(path: Path) -> LoadedApp:
    """Read ``path``, import its application and build the typed config, or raise ConfigError."""
    data, digest = load_toml(path)
    node_table = data.get("node", {})
    app_name = node_table.get("app", DEFAULT_APP) if isinstance(node_table, dict) else DEFAULT_APP
    if not isinstance(app_name, str):
        raise ConfigError(f"{path}: node.app: expected str, got {app_name!r}")
    try:
        module = importlib.import_module(app_name)
    except ImportError as exc:
        raise ConfigError(f"{path}: node.app: cannot import {app_name!r}: {exc}") from exc
    config_cls = getattr(module, "Config", None)
    build_tree = getattr(module, "build_tree", None)
    if config_cls is None or not callable(build_tree):
        raise ConfigError(f"{path}: node.app: {app_name!r} defines no Config and build_tree")
    config = structure(data, config_cls, str(path))
    return LoadedApp(config, config.node, config.log, build_tree, digest)
