"""Opening a file on the pod's host for a tool: regular files only. A device such as
/dev/zero says size 0 and never ends; a FIFO's open waits for the other end (a reader for a
write, a writer for a read) and would hold a thread for ever. So the file is opened without
blocking and checked on the open descriptor before a byte moves; a read is bounded by the
bytes it reads, not by what `stat` said."""

from __future__ import annotations

import os
import stat

from api.tools.tools_io import not_regular, too_large

_FLAGS = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_regular(full: str, path: str, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of the regular file `full` (`path`: as the caller named it); None
    when it cannot be opened (a folder included); FileRefused otherwise."""
    try:
        fd = os.open(full, os.O_RDONLY | _FLAGS)
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        mode = 0
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode) or not mode:
            return None
        raise not_regular(path)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError:
            return None
    if len(data) > max_bytes:
        raise too_large(path, max_bytes)
    return data


def write_regular(full: str, path: str, content: bytes) -> bool:
    """`content` as the whole of the regular file `full`, created when missing; False when it
    cannot be written; FileRefused for a device, FIFO or socket (truncated only once it is
    known to be a regular file)."""
    try:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | _FLAGS, 0o666)
    except OSError:
        return False  # a FIFO with no reader: ENXIO
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        os.close(fd)
        raise not_regular(path)
    with os.fdopen(fd, "wb") as f:
        try:
            os.set_blocking(fd, True)
            f.truncate(0)
            f.write(content)
        except OSError:
            return False
    return True
