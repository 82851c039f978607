"""Where a tool's path lands: llama-server's resolution (a leading `~` is the home folder, a
relative path joins the call's cwd or the pod's working directory, `.` and `..` are dropped
lexically), then, with --tools-root (ours), the confinement: the real path (every symlink
followed) must be the root or inside it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class OutsideRootError(Exception):
    """A path, after its `..` and symlinks, is not inside --tools-root."""


def expand_home(path: str) -> str:
    if not path.startswith("~") or (len(path) > 1 and path[1] not in "/\\"):
        return path
    home = os.environ.get("HOME", "")
    return home + path[1:] if home else path


def resolve(path: str, cwd: str) -> str:
    """Absolute, normalised (`server-tools.cpp` tools_io_basic::resolve): `cwd` empty is the
    process's working directory."""
    full = expand_home(path)
    if not os.path.isabs(full):
        full = os.path.join(cwd or os.getcwd(), full)
    return os.path.normpath(full).replace("\\", "/")


@dataclass(frozen=True)
class Confinement:
    """--tools-root: the folder every file tool and the cwd header must stay inside (None:
    none, as llama-server)."""

    root: str | None = None

    def check(self, path: str) -> str:
        """`path` (absolute) if its real path is inside the root, else OutsideRootError. For a
        path that does not exist yet, its nearest existing parent is what is checked, so a
        symlinked folder cannot smuggle a new file out."""
        if self.root is None:
            return path
        real_root = os.path.realpath(self.root)
        probe = Path(path)
        while not os.path.lexists(probe) and probe.parent != probe:
            probe = probe.parent
        real = os.path.realpath(probe)
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            raise OutsideRootError(f"path is outside the tools root ({self.root}): {path}")
        return path

    def default_cwd(self, cwd: str) -> str:
        """The cwd a call runs in: the one it asked for, else the root (None: the pod's)."""
        return cwd or (self.root or "")
