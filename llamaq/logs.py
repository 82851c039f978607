"""Logging set-up from llama-server's verbosity levels."""

from __future__ import annotations

import logging

LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO,
          4: logging.DEBUG, 5: logging.DEBUG}


def setup_logging(verbosity: int, log_file: str | None, process: str) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(
        level=LEVELS.get(verbosity, logging.DEBUG),
        format=f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
    )
