"""What a tool does to files and commands, behind one interface, so that the same tools run on
the pod's host (`host_io.py`) or inside a container (`container_io.py`), as llama-server's
`tools_io` does."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ParamSpec, TypeVar

from api.tools.process import ExecResult, OnChunk
from api.tools.threads import ToolThreads

P = ParamSpec("P")
R = TypeVar("R")

JUNK_DIR_NAMES = frozenset({
    ".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
    "target", ".cache", ".idea", ".vscode",
})
"""Folders a listing reports but never walks into: they can be enormous."""
LIST_TIMEOUT_S = 15
GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024
NOT_A_DIRECTORY = "path does not exist or is not a directory"
FILE_READ_MAX = 32 * 1024 * 1024
"""The most bytes any tool reads of one file (ours: llama-server reads whatever it is given)."""


class FileRefused(Exception):
    """A read or write that is refused, its message the tool's error: a device, FIFO or
    socket (which could block or never end), or a file with more bytes than the read's bound."""


def not_regular(path: str) -> FileRefused:
    return FileRefused(f"not a regular file: {path}")


def too_large(path: str, max_bytes: int) -> FileRefused:
    return FileRefused(f"file too large (more than {max_bytes} bytes): {path}")


class ListKind(StrEnum):
    FILES = "file"
    DIRS = "dir"
    ALL = "all"


@dataclass
class ListEntry:
    rel: str  # '/'-separated, relative to the listed folder
    is_dir: bool = False


@dataclass
class ListResult:
    entries: list[ListEntry] = field(default_factory=list)
    err: str = ""  # set when the base is not a folder
    truncated: bool = False  # the walk could not see everything (time budget, unreadable)


def entry_depth(rel: str) -> int:
    return 1 + rel.count("/")


class ToolsIO(abc.ABC):
    """Paths are resolved against the call's cwd; every method takes an unresolved path."""

    threads: ToolThreads | None = None
    """The tools' own threads (the service sets them); asyncio's default ones when None."""

    async def offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn` in a thread: the call's file work and its CPU work (regexes, globs, lines)."""
        if self.threads is None:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return await self.threads.run(fn, *args, **kwargs)

    @abc.abstractmethod
    def resolve(self, path: str) -> str: ...

    @abc.abstractmethod
    async def is_directory(self, path: str) -> bool: ...

    @abc.abstractmethod
    async def is_regular_file(self, path: str) -> bool: ...

    @abc.abstractmethod
    async def file_size(self, path: str) -> int | None: ...

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int = FILE_READ_MAX) -> bytes | None:
        """The file's bytes, None when it cannot be opened; FileRefused for what is not a
        regular file, or has more than `max_bytes` (counted as read, not as stat says)."""

    @abc.abstractmethod
    async def write_file(self, path: str, content: bytes) -> bool:
        """False when it cannot be written; FileRefused for what is not a regular file."""

    @abc.abstractmethod
    async def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult: ...

    @abc.abstractmethod
    async def run(self, args: list[str], max_output: int, timeout_s: int,
                  on_chunk: OnChunk | None = None) -> ExecResult: ...

    @property
    @abc.abstractmethod
    def is_isolate(self) -> bool:
        """True when the tools run elsewhere than on the pod's host (a container)."""
