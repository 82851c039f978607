"""Background tasks that must live as long as their process: if one ends, the process ends
(with a non-zero exit, so that a supervisor restarts it) instead of living on as a zombie."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, NoReturn

log = logging.getLogger(__name__)


class BackgroundTaskDied(RuntimeError):
    """A task that should run forever ended."""


async def watch(tasks: Mapping[str, asyncio.Task[Any]]) -> NoReturn:
    """Wait until one of the tasks ends, then raise BackgroundTaskDied naming it."""
    by_task = {task: name for name, task in tasks.items()}
    done, _ = await asyncio.wait(by_task, return_when=asyncio.FIRST_COMPLETED)
    task = next(iter(done))
    name = by_task[task]
    error = None if task.cancelled() else task.exception()
    log.critical("background task %r ended (%s); stopping the process", name,
                 repr(error) if error else "cancelled" if task.cancelled() else "returned")
    raise BackgroundTaskDied(f"background task {name!r} ended") from error


def exit_when_done(task: asyncio.Task[Any], name: str, stop: Any) -> None:
    """When `task` ends while its process runs, log why and call `stop()` (which must end the
    process with a non-zero status)."""

    def ended(done: asyncio.Task[Any]) -> None:
        if done.cancelled():
            return  # a shutdown
        log.critical("background task %r ended (%r); stopping the process", name,
                     done.exception())
        stop()

    task.add_done_callback(ended)
