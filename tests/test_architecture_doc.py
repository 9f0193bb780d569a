"""ARCHITECTURE.md names only what exists, so a stranger following it never hits a dead end.

Every backticked path (``actors/store/keys.py``, ``actors/store/lua/*.lua``,
``actors/execution/handlers.py``), every ``path.attribute`` (``actors/store/keys.schedule_id``),
every Lua script named alone (``claim_due.lua``, ``lua/flight.lua``: the store's scripts) and
every test named (``test_...``) is checked against the tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"
LUA = ROOT / "actors" / "store" / "lua"
#: Top-level folders of the repository: a backticked token starting with one names a path.
TOP = ("actors/", "runtime/", "metronome/", "tests/", "bench/", "deploy/", "docs/")
FILE = re.compile(r"\.(py|lua|md|toml|acl|ya?ml|json|sh|png)$")


def _spans() -> list[str]:
    return re.findall(r"`([^`\n]+)`", DOC.read_text())


def _tokens() -> list[str]:
    return [tok for span in _spans() for tok in re.findall(r"[\w./*+-]+", span)]


def _defines(module: Path, name: str) -> bool:
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def _missing_path(token: str) -> str | None:
    """Why ``token`` (a path of the repository, maybe a glob or ``path.attribute``) names
    nothing, or None when it names something."""
    if "*" in token:
        return None if list(ROOT.glob(token)) else "no file matches"
    if token.endswith("/") or FILE.search(token):
        return None if (ROOT / token).exists() else "no such file or folder"
    module, _, attribute = token.rpartition(".")
    path = ROOT / f"{module}.py"
    if not path.exists():
        return f"no module {module}.py"
    return None if _defines(path, attribute) else f"{module}.py defines no {attribute}"


def test_every_path_the_document_names_exists() -> None:
    paths = sorted({t for t in _tokens() if t.startswith(TOP)})
    assert len(paths) > 100  # the modules table alone names more: the pattern still finds them
    missing = {t: why for t in paths if (why := _missing_path(t))}
    assert missing == {}


def test_every_lua_script_the_document_names_exists() -> None:
    scripts = {t for t in _tokens() if t.endswith(".lua") and not t.startswith(TOP)}
    assert len(scripts) > 20
    missing = sorted(s for s in scripts if "*" not in s and not (LUA / Path(s).name).exists())
    assert missing == []
    relative = sorted(s for s in scripts if "/" in s and not (LUA.parent / s).exists())
    assert relative == []


def test_every_test_the_document_names_exists() -> None:
    defined = {
        node.name
        for path in (ROOT / "tests").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    named = {t for t in _tokens() if re.fullmatch(r"test_\w+", t)}
    assert len(named) > 50
    assert sorted(named - defined) == []
