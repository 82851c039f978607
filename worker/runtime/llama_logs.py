"""llama.cpp's own log lines, routed into Python logging (debug level) instead of stderr."""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as lc

log = logging.getLogger("llama_cpp")
GGML_LOG_LEVEL_ERROR = 4
ABORTED_LINES = ("failed with error 1", "compute status: 1", "failed to decode, ret = 2")
"""What llama.cpp logs as errors when the abort callback stopped a decode (GGML_STATUS_ABORTED
is 1, llama_decode's status 2): the embedder does that on purpose (worker/embed/embedder.py), so
they are debug lines."""


@lc.llama_log_callback
def _to_logging(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if level != GGML_LOG_LEVEL_ERROR and not log.isEnabledFor(logging.DEBUG):
        return
    line = text.decode("utf-8", errors="replace").rstrip()
    if level == GGML_LOG_LEVEL_ERROR and not line.endswith(ABORTED_LINES):
        log.error("%s", line)
    else:
        log.debug("%s", line)


def route_llama_logs() -> None:
    lc.llama_log_set(_to_logging, ctypes.c_void_p(0))


def route_mtmd_logs() -> None:
    """The multimodal library's lines (worker/runtime/media.py) the same way."""
    from llama_cpp import mtmd_cpp

    mtmd_cpp.mtmd_log_set(_to_logging, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(_to_logging, ctypes.c_void_p(0))
