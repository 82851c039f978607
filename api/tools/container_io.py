"""Tools inside a running container, every operation a command through `<engine> exec`
(llama-server's `tools_io_isolate` and `tools_io_container`): the image needs a POSIX `sh`,
`cat`, `wc`, `mkdir`, `dirname`, `find` and `timeout`. Paths are the container's; --tools-root
does not apply there (the container is the confinement)."""

from __future__ import annotations

from api.tools.git_list import LS_FILES, SAFE_ENV, git_argv
from api.tools.process import ExecResult, OnChunk, run_command
from api.tools.tools_io import (
    FILE_READ_MAX,
    GIT_LS_FILES_MAX_OUTPUT,
    JUNK_DIR_NAMES,
    NOT_A_DIRECTORY,
    ListEntry,
    ListKind,
    ListResult,
    ToolsIO,
    entry_depth,
    not_regular,
    too_large,
)

AUX_TIMEOUT_S = 15  # stat, mkdir and listing helpers; a command has its own timeout
NOT_REGULAR_EXIT = 3  # the read's shell: the path is not a regular file


def _split_lines(text: str, strip_dot_slash: bool) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line:
            continue
        if strip_dot_slash and line.startswith("./"):
            line = line[2:]
        out.append(line.replace("\\", "/"))
    return out


class ContainerIO(ToolsIO):
    def __init__(self, engine: str, container_id: str, cwd: str = "") -> None:
        self.engine = engine
        self.container_id = container_id
        self.cwd = cwd

    @property
    def is_isolate(self) -> bool:
        return True

    def argv(self, inner: list[str], needs_stdin: bool = False) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return f"{self.cwd}/{path}"

    async def _exec(self, inner: list[str], max_output: int = 4096,
                    combine_stderr: bool = True) -> ExecResult:
        return await run_command(self.argv(inner), max_output, AUX_TIMEOUT_S,
                                 combine_stderr=combine_stderr)

    async def _test(self, flag: str, path: str) -> bool:
        res = await self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path])
        return res.exit_code == 0 and not res.timed_out

    async def is_directory(self, path: str) -> bool:
        return await self._test("-d", self.resolve(path))

    async def is_regular_file(self, path: str) -> bool:
        return await self._test("-f", self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out:
            return None
        try:
            return int(res.output.strip())
        except ValueError:
            return None

    async def read_file(self, path: str, max_bytes: int = FILE_READ_MAX) -> bytes | None:
        # stderr kept out of the bytes; a device or FIFO refused before it is opened
        inner = ["sh", "-c", f'[ -f "$1" ] || exit {NOT_REGULAR_EXIT}; exec head -c "$2" "$1"',
                 "_", self.resolve(path), str(max_bytes + 1)]
        res = await run_command(self.argv(inner), max_bytes + 1, AUX_TIMEOUT_S,
                                combine_stderr=False)
        if res.exit_code == NOT_REGULAR_EXIT and not res.timed_out:
            raise not_regular(path)
        if res.exit_code != 0 or res.timed_out:
            return None
        data = res.output.encode()
        if len(data) > max_bytes:
            raise too_large(path, max_bytes)
        return data

    async def write_file(self, path: str, content: bytes) -> bool:
        inner = ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)]
        res = await run_command(self.argv(inner, needs_stdin=True), 4096, AUX_TIMEOUT_S,
                                stdin_data=content)
        return res.exit_code == 0 and not res.timed_out

    async def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult:
        abs_base = self.resolve(base)
        if not await self.is_directory(base):
            return ListResult(err=NOT_A_DIRECTORY)
        if kind is ListKind.FILES:
            env = [f"{k}={v}" for k, v in SAFE_ENV.items()]
            res = await self._exec(["sh", "-c", 'cd "$1" && shift && exec env "$@"', "_",
                                    abs_base, *env, *git_argv(*LS_FILES)],
                                   GIT_LS_FILES_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                return ListResult([ListEntry(rel) for rel in _split_lines(res.output, False)
                                   if not (max_depth > 0 and entry_depth(rel) > max_depth)])
        out = ListResult()
        if kind is not ListKind.FILES:
            out.entries += [ListEntry(r, True) for r in await self._find(abs_base, max_depth,
                                                                         True, out)]
        if kind is not ListKind.DIRS:
            out.entries += [ListEntry(r) for r in await self._find(abs_base, max_depth, False,
                                                                   out)]
        return out

    async def _find(self, abs_base: str, max_depth: int, dirs: bool, out: ListResult
                    ) -> list[str]:
        prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIR_NAMES))
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {max_depth}"
        cmd += f" \\( {prune} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = await self._exec(["sh", "-c", cmd, "_", abs_base], GIT_LS_FILES_MAX_OUTPUT)
        out.truncated = out.truncated or res.timed_out
        return _split_lines(res.output, True)

    async def run(self, args: list[str], max_output: int, timeout_s: int,
                  on_chunk: OnChunk | None = None) -> ExecResult:
        """The container's own `timeout` ends the command in there (killing our `exec` client
        would not); ours, 5 s later, ends the client."""
        inner = ["timeout", f"{timeout_s}s", *args]
        if self.cwd:  # 127: what a shell says of a command it could not run
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return await run_command(self.argv(inner, needs_stdin=True), max_output, timeout_s + 5,
                                 on_chunk, stdin_data=b"")
