"""The raft core is sans-IO: no trio, sockets, clocks, threads or global randomness
(STYLE.md §1-2). Only ``node.py`` (with its parts ``node_driver.py``, ``node_ready.py``
and ``node_ops.py``), ``transport.py`` and ``rocks_storage.py`` (the adapters) may use
them."""

from __future__ import annotations

import ast
from pathlib import Path

import futureq.raft

FORBIDDEN = {"trio", "socket", "time", "random", "threading", "asyncio", "rocksdict", "os"}
ADAPTERS = {
    "node.py",
    "node_driver.py",
    "node_ready.py",
    "node_ops.py",
    "transport.py",
    "rocks_storage.py",
}


def _runtime_imports(tree: ast.Module) -> set[str]:
    """Top-level module names imported outside ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
            for field in ("body", "orelse", "handlers", "finalbody"):
                child = getattr(node, field, None)
                if isinstance(child, list):
                    visit([c for c in child if isinstance(c, ast.stmt)])

    visit(tree.body)
    return names


def test_core_modules_import_no_io() -> None:
    package = Path(futureq.raft.__file__).parent
    checked = 0
    for path in sorted(package.glob("*.py")):
        if path.name in ADAPTERS:
            continue
        imports = _runtime_imports(ast.parse(path.read_text()))
        assert not imports & FORBIDDEN, f"{path.name} imports {sorted(imports & FORBIDDEN)}"
        checked += 1
    assert checked >= 7
