"""The package's layers: each module imports only from its own layer or those below it.

Read from the source (every import, function-local ones included, since a lazy import is still
a dependency). From the bottom: the base modules (errors, settings, device, timing...); the
graph model, backends, NDArray and params; the kernel library (lib/); the runtime; the
planner (it measures by running the runtime); and at the top the importer, disco, the CLI and
subgraphs.py, which hands the kernel library its sub-graph builder. Inside lib/, the runtime
asks ops for facts through the registry, never an op family or a kernel family directly, and
the oneDNN kernels sit below the CPU kernels that choose among them.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "graph_runtime"

BASE = {"errors", "settings", "dtypes", "device", "_text", "_lru", "_load", "_timing",
        "_version"}
CORE = {"graph", "backends", "nd", "params"}
# What each layer may import (its own layer always). The top (frontend, disco, cli,
# subgraphs, the package's __init__) may import anything.
ALLOWED = {
    "base": {"base"},
    "core": {"base", "core"},
    "lib": {"base", "core", "lib"},
    "runtime": {"base", "core", "lib", "runtime"},
    "planner": {"base", "core", "lib", "runtime", "planner"},
    "frontend": {"base", "core", "lib", "frontend"},
}
# Imports that cross a line on purpose, each with its reason.
EXCEPTIONS = {
    # The kinds of device listed first in device()'s error message are the backends registry's
    # (adding a device touches one file plus that registry line: STYLE.md).
    ("graph_runtime.device", "graph_runtime.backends"),
}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[str]:
    """Every graph_runtime module module imports (names from a package count as modules)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:
                yield from (f"{target}.{a.name}" for a in node.names)
            else:
                yield target
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "top"  # the package's __init__: the public API, over everything
    name = parts[1]
    if name in BASE:
        return "base"
    if name in CORE:
        return "core"
    if name in ("lib", "runtime", "planner", "frontend"):
        return name
    return "top"


def _edges() -> list[tuple[str, str]]:
    return [(module, target) for module, path in _modules()
            for target in _imports(module, path) if target.startswith("graph_runtime")]


def test_each_layer_imports_only_itself_and_below() -> None:
    wrong = []
    for module, target in _edges():
        layer, to = _layer(module), _layer(target)
        allowed = ALLOWED.get(layer)
        if allowed is not None and to not in allowed | {layer} \
                and (module, target) not in EXCEPTIONS:
            wrong.append(f"{module} ({layer}) imports {target} ({to})")
    assert wrong == [], "\n".join(wrong)


def _family(module: str) -> str | None:
    """lib.ops or lib.kernels.<family> for a module inside one, else None."""
    parts = module.split(".")
    if parts[1:3] == ["lib", "ops"] and len(parts) > 3:
        return "lib.ops"
    if parts[1:3] == ["lib", "kernels"] and len(parts) > 4:
        return f"lib.kernels.{parts[3]}"
    return None


def test_the_runtime_asks_ops_through_the_registry() -> None:
    wrong = [f"{m} imports {t}" for m, t in _edges()
             if _layer(m) == "runtime" and _family(t) is not None]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("lower, upper", [("lib.kernels.onednn", "lib.kernels.cpu")])
def test_kernel_families_import_one_way(lower: str, upper: str) -> None:
    wrong = [f"{m} imports {t}" for m, t in _edges()
             if _family(m) == lower and _family(t) == upper]
    assert wrong == [], "\n".join(wrong)


def test_the_rules_see_the_imports_they_judge() -> None:
    edges = set(_edges())
    # a function-local import counts: subgraphs.py imports the frontend inside import_model
    assert ("graph_runtime.subgraphs", "graph_runtime.frontend") in edges
    assert _layer("graph_runtime.graph.storage_plan") == "core"
    assert _family("graph_runtime.lib.kernels.cpu.conv") == "lib.kernels.cpu"
    assert _family("graph_runtime.lib.kernels.threads") is None  # shared by the families
