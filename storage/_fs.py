"""Local file helpers: atomic replacement and inter-process locks."""

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(target: Path, tmp_dir: Path | None = None) -> Iterator[Path]:
    """Yield a temporary path; on success it replaces `target`, on error it is removed.

    `tmp_dir` must be on the same filesystem as `target` (default: target's folder).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    directory = tmp_dir if tmp_dir is not None else target.parent
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(0o644)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
