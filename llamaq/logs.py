"""Logging and process set-up from llama-server's log and priority flags."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from scheduler.common_settings import CommonSettings

log = logging.getLogger(__name__)

LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO,
          4: logging.DEBUG, 5: logging.DEBUG}
NICENESS = {-1: 5, 0: 0, 1: -5, 2: -10, 3: -20}
"""--prio levels as llama.cpp's set_process_priority maps them to nice values."""


JSONL_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn",
                logging.ERROR: "error", logging.CRITICAL: "error"}
"""llama.cpp's level names in a JSON line (common/log.cpp level_str)."""
COLORS = {logging.DEBUG: "\033[33m", logging.INFO: "\033[32m", logging.WARNING: "\033[35m",
          logging.ERROR: "\033[31m", logging.CRITICAL: "\033[31m"}
"""llama.cpp's colors of a level (common/log.cpp): yellow, green, magenta, red."""
RESET, BLUE = "\033[0m", "\033[34m"


class JsonlFormatter(logging.Formatter):
    """--log-jsonl: `{"type": "log", "time", "level", "msg"}` a line, as llama.cpp's common log
    writes it (`time`: microseconds since the log started, 0 with --no-log-timestamps)."""

    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps
        self.start = time.monotonic()

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        at = int((time.monotonic() - self.start) * 1e6) if self.timestamps else 0
        return json.dumps({"type": "log", "time": at,
                           "level": JSONL_LEVELS.get(record.levelno, "info"),
                           "msg": message + "\n"}, ensure_ascii=False)


class ColorFormatter(logging.Formatter):
    """--log-colors: the level in llama.cpp's color, the timestamp in blue."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        color = COLORS.get(record.levelno, "")
        stamp = self.formatTime(record) if "%(asctime)s" in (self._fmt or "") else ""
        if stamp and text.startswith(stamp):
            text = f"{BLUE}{stamp}{RESET}{text[len(stamp):]}"
        return text.replace(record.levelname, f"{color}{record.levelname}{RESET}", 1)


def setup_logging(verbosity: int, log_file: str | None, process: str, *, disable: bool = False,
                  prefix: bool = True, timestamps: bool = True, jsonl: bool = False,
                  colors: str = "auto") -> None:
    head = "%(asctime)s " if timestamps else ""
    tail = f"{process} %(levelname)s %(name)s: " if prefix else ""
    plain = f"{head}{tail}%(message)s"
    console = logging.StreamHandler(sys.stdout if jsonl else sys.stderr)
    if jsonl:  # JSON lines to stdout, no colors (llama.cpp's)
        console.setFormatter(JsonlFormatter(timestamps))
    elif colors == "on" or (colors == "auto" and console.stream.isatty()):
        console.setFormatter(ColorFormatter(plain))
    else:
        console.setFormatter(logging.Formatter(plain))
    handlers: list[logging.Handler] = [console]
    if log_file:
        to_file = logging.FileHandler(log_file)
        to_file.setFormatter(JsonlFormatter(timestamps) if jsonl else logging.Formatter(plain))
        handlers.append(to_file)
    logging.basicConfig(
        level=logging.CRITICAL + 1 if disable else LEVELS.get(verbosity, logging.DEBUG),
        handlers=handlers,
    )


def prepare_process(settings: CommonSettings, process: str) -> None:
    """Logging from -lv/-v/--log-*, then the process priority from --prio."""
    setup_logging(settings.verbosity(), settings.log_file, process,
                  disable=settings.log_disable, prefix=settings.log_prefix,
                  timestamps=settings.log_timestamps, jsonl=settings.log_jsonl,
                  colors=settings.log_colors)
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
