"""The threads that the tools' work runs in: a pool of their own, so that slow calls (a grep
that runs its whole time budget, a 32 MiB read) wait for each other and never for the threads
the rest of the pod shares (asyncio's default executor: big request bodies, the store, media),
which a few such calls would otherwise fill for seconds. Ours: llama-server runs tools in
its HTTP threads."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

TOOL_THREADS = 4

P = ParamSpec("P")
R = TypeVar("R")


class ToolThreads:
    def __init__(self, workers: int = TOOL_THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llamaq-tools")

    async def run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)` in one of the pool's threads (as asyncio.to_thread: with the
        caller's context)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
