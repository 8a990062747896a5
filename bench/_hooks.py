"""Run a bench module's ``install()`` inside broker processes, at their start-up.

A bench that must observe a node from the inside (timestamps at stages of a request,
the garbage collector's pauses) puts a ``sitecustomize`` on the node's ``PYTHONPATH``:
Python imports it before ``futureq`` starts, and it calls ``install()`` of the bench
module, which wraps or hooks what it measures. Nothing in ``src`` knows about it.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (``bench`` is imported from here in the node process)."""


def hooked_env(directory: Path, module: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node process that runs ``module.install()`` at start-up.

    Args:
        directory: An empty scratch directory (the ``sitecustomize`` goes in it).
        module: Dotted name of a bench module with an ``install()`` function.
        extra: More environment for the node (what ``install()`` reads).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport {module}\n{module}.install()\n"
    )
    python_path = os.pathsep.join([str(directory), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": python_path, **(extra or {})}
