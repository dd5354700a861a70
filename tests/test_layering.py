"""Dependency rules: the core stays pure, and dependencies point one way.

integrations -> scheduler core -> predictors. The core (predictors/, scheduler/spec, pools, cost,
placement, simulate) imports no Kubernetes, Ray, HTTP, database or Prometheus client, and predictors/
imports nothing from scheduler/.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_CORE = ("kubernetes", "ray", "starlette", "uvicorn", "fastapi", "httpx", "requests", "aiohttp",
                     "urllib.request", "urllib3", "http.server", "http.client", "sqlite3", "_sqlite3",
                     "prometheus_client", "psycopg", "sqlalchemy")
ADAPTER_DIRS = ("scheduler/integrations", "scheduler/cli", "scheduler/calibrate")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports by name, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = path.relative_to(REPO).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom):  # from . import x / from ..integrations import y
            base = package[:len(package) - node.level + 1] if node.level > 1 else package
            names.update(".".join((*base, *([node.module] if node.module else []), alias.name)).rstrip(".")
                         for alias in node.names)
            if node.module:
                names.add(".".join((*base, node.module)))
    return names


def _core_files() -> list[Path]:
    files = sorted((REPO / "predictors").rglob("*.py"))
    for path in sorted((REPO / "scheduler").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(ADAPTER_DIRS):
            files.append(path)
    return files


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_core_imports_no_adapters(path: Path) -> None:
    bad = {name for name in _imports(path) for f in FORBIDDEN_IN_CORE if name == f or name.startswith(f + ".")}
    assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((REPO / "predictors").rglob("*.py")), ids=lambda p: p.name)
def test_predictors_import_nothing_from_scheduler(path: Path) -> None:
    assert not {n for n in _imports(path) if n == "scheduler" or n.startswith("scheduler.")}


def test_nothing_outside_integrations_imports_them() -> None:
    for path in _core_files():
        assert not {n for n in _imports(path) if n.startswith("scheduler.integrations")}, path


# every core module, as Python imports it
_CORE_MODULES = [path.relative_to(REPO).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
                 for path in _core_files()]


def test_importing_the_core_loads_no_adapter_even_indirectly() -> None:
    """The rule is about what a core module brings in at all, through any chain of imports: a fresh interpreter
    imports every core module and lists what got loaded (an import the AST check above cannot see, such as one
    reached through another package, shows here)."""
    probe = ("import importlib, json, sys\n"
             f"for name in {_CORE_MODULES!r}:\n"
             "    importlib.import_module(name)\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                                       check=True).stdout)
    bad = sorted(m for m in loaded for f in (*FORBIDDEN_IN_CORE, *(d.replace("/", ".") for d in ADAPTER_DIRS))
                 if m == f or m.startswith(f + "."))
    assert not bad, f"importing the core loads {bad}"
