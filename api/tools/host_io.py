"""Tools on the api pod's own host: files through the filesystem (in a thread, never on the
event loop), commands as child processes; --tools-root confines every path (`paths.py`)."""

from __future__ import annotations

import os
import time

from api.tools.git_list import LS_FILES, git_argv, git_env
from api.tools.host_files import read_regular, write_regular
from api.tools.paths import Confinement, resolve
from api.tools.process import ExecResult, OnChunk, run_command
from api.tools.tools_io import (
    FILE_READ_MAX,
    GIT_LS_FILES_MAX_OUTPUT,
    JUNK_DIR_NAMES,
    LIST_TIMEOUT_S,
    NOT_A_DIRECTORY,
    ListEntry,
    ListKind,
    ListResult,
    ToolsIO,
    entry_depth,
)


class HostIO(ToolsIO):
    def __init__(self, cwd: str = "", confinement: Confinement | None = None) -> None:
        self.confinement = confinement or Confinement()
        self.cwd = self.confinement.default_cwd(cwd)

    @property
    def is_isolate(self) -> bool:
        return False

    def resolve(self, path: str) -> str:
        return resolve(path, self.cwd)

    def checked(self, path: str) -> str:
        """Resolved, and inside --tools-root (OutsideRootError otherwise)."""
        return self.confinement.check(self.resolve(path))

    async def is_directory(self, path: str) -> bool:
        return await self.offload(os.path.isdir, self.checked(path))

    async def is_regular_file(self, path: str) -> bool:
        return await self.offload(os.path.isfile, self.checked(path))

    async def file_size(self, path: str) -> int | None:
        full = self.checked(path)
        try:
            return await self.offload(os.path.getsize, full)
        except OSError:
            return None

    async def read_file(self, path: str, max_bytes: int = FILE_READ_MAX) -> bytes | None:
        return await self.offload(read_regular, self.checked(path), path, max_bytes)

    async def write_file(self, path: str, content: bytes) -> bool:
        full = self.checked(path)

        def write() -> bool:
            try:
                parent = os.path.dirname(full)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                    self.confinement.check(full)  # the new folders are still inside
            except OSError:
                return False
            return write_regular(full, path, content)

        return await self.offload(write)

    async def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult:
        full = self.checked(base)
        if not await self.offload(os.path.isdir, full):
            return ListResult(err=NOT_A_DIRECTORY)
        deadline = time.monotonic() + LIST_TIMEOUT_S
        if kind is ListKind.FILES:  # git cannot list folders: the walker does those
            res = await run_command(git_argv("-C", full, *LS_FILES), GIT_LS_FILES_MAX_OUTPUT,
                                    LIST_TIMEOUT_S, cwd=full, env=git_env(),
                                    combine_stderr=False)
            if res.exit_code == 0 and not res.timed_out:
                return await self.offload(self._git_entries, full, res.output, max_depth)
        return await self.offload(_walk, full, max_depth, kind, deadline)

    @staticmethod
    def _git_entries(base: str, output: str, max_depth: int) -> ListResult:
        out = ListResult()
        for line in output.splitlines():
            rel = line.rstrip("\r").replace("\\", "/")
            if not rel or (max_depth > 0 and entry_depth(rel) > max_depth):
                continue
            if os.path.isfile(os.path.join(base, rel)):
                out.entries.append(ListEntry(rel))
        return out

    async def run(self, args: list[str], max_output: int, timeout_s: int,
                  on_chunk: OnChunk | None = None) -> ExecResult:
        cwd = self.confinement.check(self.resolve(self.cwd)) if self.cwd else ""
        return await run_command(args, max_output, timeout_s, on_chunk, cwd=cwd)


def _walk(base: str, max_depth: int, kind: ListKind, deadline: float) -> ListResult:
    """The listing without git: links are never walked (one may point back up), junk folders
    are listed but not walked, a time budget marks the result truncated."""
    out = ListResult()
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        folder, rel_dir, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            out.truncated = True
            continue
        for entry in entries:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
                is_link = entry.is_symlink()
            except OSError:
                continue
            if is_dir:
                if kind is not ListKind.FILES:
                    out.entries.append(ListEntry(rel, True))
                if entry.name in JUNK_DIR_NAMES or is_link:
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif is_file and kind is not ListKind.DIRS:
                out.entries.append(ListEntry(rel))
    return out
