"""Children of `llamaq up` die with it: PR_SET_PDEATHSIG through libc's prctl (Linux)."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

PARENT_PID_ENV = "LLAMAQ_PARENT_PID"
"""Set by `llamaq up` for its children: the pid they must not outlive."""
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies. Kept across exec,
    so it also works as a `preexec_fn` for a child such as redis-server. No-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
