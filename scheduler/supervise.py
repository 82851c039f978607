"""Background tasks that must live as long as their process: if one ends, the process ends
(with a non-zero exit, so that a supervisor restarts it) instead of living on as a zombie."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


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
