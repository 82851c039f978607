"""Logging and process set-up from llama-server's log and priority flags."""

from __future__ import annotations

import logging
import os

from scheduler.common_settings import CommonSettings

log = logging.getLogger(__name__)

LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO,
          4: logging.DEBUG, 5: logging.DEBUG}
NICENESS = {-1: 5, 0: 0, 1: -5, 2: -10, 3: -20}
"""--prio levels as llama.cpp's set_process_priority maps them to nice values."""


def setup_logging(verbosity: int, log_file: str | None, process: str, *, disable: bool = False,
                  prefix: bool = True, timestamps: bool = True) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    head = "%(asctime)s " if timestamps else ""
    tail = f"{process} %(levelname)s %(name)s: " if prefix else ""
    logging.basicConfig(
        level=logging.CRITICAL + 1 if disable else LEVELS.get(verbosity, logging.DEBUG),
        format=f"{head}{tail}%(message)s",
        handlers=handlers,
    )


def prepare_process(settings: CommonSettings, process: str) -> None:
    """Logging from -lv/-v/--log-*, then the process priority from --prio."""
    setup_logging(settings.verbosity(), settings.log_file, process,
                  disable=settings.log_disable, prefix=settings.log_prefix,
                  timestamps=settings.log_timestamps)
    set_priority(settings.prio)


def set_priority(prio: int) -> bool:
    """Renice this process as llama.cpp does for --prio; a warning when not allowed."""
    if prio == 0:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICENESS[prio])
    except OSError as exc:
        log.warning("failed to set process priority %d: %s", prio, exc)
        return False
    return True
