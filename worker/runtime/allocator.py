"""glibc malloc's settings for the worker process.

The worker copies KV states of several MiB through short-lived buffers: a context checkpoint
(7.5 MiB on Gemma 3 at -np 4) is read into a ctypes buffer, then copied into bytes; host-cache
and KV-tier states, slot saves, likewise. glibc serves a block that large with mmap and
returns it on free, but its threshold is dynamic: after the first such free it rises past that
size (up to 32 MiB), and from then on the blocks come from the thread's arena, where a freed
one stays resident (about 7 MiB after one long prompt, measured with `bench/kv_tiers.py
--memory`). A fixed threshold (which also turns the dynamic one off) keeps every block of
1 MiB or more on its own mapping, returned to the system when freed: a page-fault pass over
each new buffer, nothing measurable beside the decode that produced it.

Not changed: the number of arenas (one per thread that allocates): MALLOC_ARENA_MAX=1 saved
1.3 MiB on the same measurement, for lock contention between the engine and the event loop.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (malloc.h)."""
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold at 1 MiB (see above); False where the C library is not glibc
    (no mallopt) or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused: the allocator keeps its own threshold")
    return done
