"""The replicated state reads nothing node-local (``DESIGN.md``, "Apply reads nothing
node-local"): no module of ``futureq.state`` imports the configuration, a clock, the
environment, the OS, randomness, sockets or trio. Group defaults reach apply inside the
commands, resolved by the leader."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import futureq.state
from futureq.state.queue_state import QueueState

FORBIDDEN = {
    "trio",
    "socket",
    "time",
    "random",
    "threading",
    "asyncio",
    "os",
    "futureq.config",
    "futureq.config_loader",
    "futureq.config_conversion",
    "futureq.config_checks",
    "futureq.config_security_checks",
    "futureq.config_cross_checks",
    "futureq.clock",
    "futureq.broker",
}


def _imports(tree: ast.Module) -> set[str]:
    """Every module imported, dotted, outside ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_state_modules_import_nothing_node_local() -> None:
    package = Path(futureq.state.__file__).parent
    checked = 0
    for path in sorted(package.glob("*.py")):
        imports = _imports(ast.parse(path.read_text()))
        bad = {
            name
            for name in imports
            if name in FORBIDDEN or any(name.startswith(f + ".") for f in FORBIDDEN)
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"
        checked += 1
    assert checked >= 6


def test_queue_state_takes_nothing_but_its_store() -> None:
    assert list(inspect.signature(QueueState).parameters) == ["store"]
