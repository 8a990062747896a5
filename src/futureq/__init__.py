"""FutureQ: a Raft-replicated delayed-message queue broker."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
