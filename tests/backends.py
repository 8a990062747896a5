"""Run one async test under each event loop the client supports (asyncio and trio).

The client library is written against AnyIO, so the same test body runs unchanged on
both; ``@on_both_backends`` turns ``async def test_x(broker)`` into two tests,
``test_x[asyncio]`` and ``test_x[trio]``, each started with ``anyio.run`` (so they do
not go through pytest-trio and take only synchronous fixtures).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import pytest

BACKENDS: Final = ("asyncio", "trio")


def on_both_backends(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Parametrize the async ``test`` over :data:`BACKENDS` (a ``backend`` argument)."""
    signature = inspect.signature(test)

    @functools.wraps(test)
    def run(*args: Any, backend: str, **kwargs: Any) -> None:
        async def main() -> None:
            await test(*args, **kwargs)

        anyio.run(main, backend=backend)

    del run.__wrapped__  # pytest reads the signature below, not the coroutine's
    keyword = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY)
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), keyword]
    )
    parametrized: Callable[..., None] = pytest.mark.parametrize("backend", BACKENDS)(run)
    return parametrized
