"""llama.cpp's own log lines, routed into Python logging (debug level) instead of stderr."""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as lc

log = logging.getLogger("llama_cpp")
GGML_LOG_LEVEL_ERROR = 4


@lc.llama_log_callback
def _to_logging(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level == GGML_LOG_LEVEL_ERROR:
        log.error("%s", text.decode("utf-8", errors="replace").rstrip())
    elif log.isEnabledFor(logging.DEBUG):
        log.debug("%s", text.decode("utf-8", errors="replace").rstrip())


def route_llama_logs() -> None:
    lc.llama_log_set(_to_logging, ctypes.c_void_p(0))
