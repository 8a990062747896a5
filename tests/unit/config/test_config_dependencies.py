"""``make run`` installs only what the broker needs: every runtime dependency of
pyproject.toml is imported by the package, every third-party module the package imports
is a runtime dependency, and the Makefile's run and cluster targets install no extras."""

from __future__ import annotations

import ast
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "src" / "futureq"
# Distribution name -> the module it is imported as, where they differ.
MODULE_OF = {"prometheus-client": "prometheus_client", "trio-websocket": "trio_websocket"}


def runtime_dependencies() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0] for spec in project["dependencies"]]
    return {MODULE_OF.get(name, name.replace("-", "_")): name for name in names}


def imported_modules() -> set[str]:
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"futureq"}


def test_every_runtime_dependency_is_imported_and_every_import_declared() -> None:
    declared = runtime_dependencies()
    imported = imported_modules()
    assert set(declared) - imported == set(), "runtime dependencies nothing imports"
    assert imported - set(declared) == set(), "imports missing from [project] dependencies"


def test_make_run_and_cluster_install_no_extras(tmp_path: pathlib.Path) -> None:
    make = shutil.which("make")
    assert make is not None
    for target, extras in (("run", None), ("cluster", None), ("test", "test"), ("bench", "bench")):
        planned = subprocess.run(
            [make, "-n", target, f"VENV={tmp_path / 'venv'}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        installs = [
            line for line in planned.splitlines() if "pip install" in line and " -e " in line
        ]
        assert installs, planned
        if extras is None:
            assert installs == [installs[0]] and installs[0].rstrip().endswith("-e ."), planned
        else:
            assert any(extras in line for line in installs), planned
