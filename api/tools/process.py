"""Running a command for a tool without blocking the event loop: its output (stdout and stderr
together) read as it comes, capped, a timeout, and its whole process group killed at the
timeout, when the caller stops listening, or when the pod stops.

llama-server's `run_subprocess` (server-tools.cpp) is the model: keep draining past the cap
so that the child never blocks on a full pipe, `[output truncated]` after a capped output, and
exit code 1 for a child that did not exit by itself (its subprocess library's EXIT_FAILURE).
Two differences: llama-server kills only the child, we kill its process group; and once the
child has exited, what is left of its group (`sleep 100 &`) gets 0.5 s to close the pipe and
is then killed, where llama-server waits for the pipe to close until the timeout."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

READ_CHUNK = 4096
POLL_S = 0.1
DRAIN_AFTER_KILL_S = 0.5
TRUNCATED = "\n[output truncated]"

OnChunk = Callable[[str], bool]
"""Called with each piece of output as it is read; returning False stops the command."""


@dataclass
class ExecResult:
    output: str
    exit_code: int = -1
    timed_out: bool = False


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_command(args: Sequence[str], max_output: int, timeout_s: float,
                      on_chunk: OnChunk | None = None, cwd: str | None = None,
                      stdin_data: bytes | None = None, combine_stderr: bool = True,
                      env: Mapping[str, str] | None = None) -> ExecResult:
    """`env`: the child's whole environment (the pod's when None)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=cwd or None, start_new_session=True, env=env,
            stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if combine_stderr else asyncio.subprocess.DEVNULL)
    except (OSError, ValueError):
        return ExecResult("failed to spawn process")
    try:
        return await _supervise(proc, max_output, timeout_s, on_chunk, stdin_data)
    finally:  # a cancelled call (the pod stops, the client left) leaves nothing running
        if proc.returncode is None:
            _kill_group(proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), DRAIN_AFTER_KILL_S)


async def _supervise(proc: asyncio.subprocess.Process, max_output: int, timeout_s: float,
                     on_chunk: OnChunk | None, stdin_data: bytes | None) -> ExecResult:
    assert proc.stdout is not None
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # a child that exits early closes its end
            proc.stdin.write(stdin_data or b"")
            await proc.stdin.drain()
        proc.stdin.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_s, 0)
    output = bytearray()
    chunks = codecs.getincrementaldecoder("utf-8")("replace")  # a chunk may end mid-character
    truncated = timed_out = stopped = False
    ended_at: float | None = None  # when the child itself exited (or was killed)
    while True:
        now = loop.time()
        if not (timed_out or stopped) and now >= deadline:
            timed_out = True
            _kill_group(proc)
            ended_at = now
        if proc.returncode is not None and ended_at is None:
            ended_at = now
        if ended_at is not None and now - ended_at > DRAIN_AFTER_KILL_S:
            _kill_group(proc)  # what is left of its group holds the pipe: ended
            break
        try:
            data = await asyncio.wait_for(proc.stdout.read(READ_CHUNK), POLL_S)
        except TimeoutError:
            continue
        if not data:
            break
        if truncated or timed_out or stopped:
            continue
        room = max_output - len(output)
        piece = data[:room]
        output += piece
        if on_chunk is not None and piece and not on_chunk(chunks.decode(piece)):
            stopped = True
            _kill_group(proc)
            ended_at = loop.time()
        if len(data) > room:
            truncated = True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), DRAIN_AFTER_KILL_S)
    if proc.returncode is None:
        _kill_group(proc)
        await proc.wait()
    code = proc.returncode if proc.returncode is not None and proc.returncode >= 0 else 1
    text = _decode(bytes(output)) + (TRUNCATED if truncated else "")
    return ExecResult(text, code, timed_out)
