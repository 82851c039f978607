"""read_file and write_file, as llama-server's (`server-tools.cpp`)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

from api.tools.params import optional, required
from api.tools.tool import Json, ServerTool, ToolCall, function, prop
from api.tools.tools_io import FileRefused

READ_MAX = 16 * 1024
READ_MAX_BASE64 = 32 * 1024 * 1024
TRUNCATED = "[output truncated]"
LINES_CHUNK = 64 << 10


def split_lines(text: str) -> list[str]:
    """Lines as std::getline gives them: split on `\\n`, no empty last line after a final one."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def iter_lines(data: bytes, chunk: int = LINES_CHUNK) -> Iterator[str]:
    """split_lines(data.decode("utf-8", "replace")), lazily: decoded and split in pieces of
    about `chunk` bytes cut after a newline (never inside a UTF-8 sequence), so that no single
    C call holds the GIL long and a caller that stops early decodes no more."""
    start, n = 0, len(data)
    while start < n:
        cut = data.find(b"\n", min(start + chunk, n) - 1)
        end = n if cut < 0 else cut + 1
        yield from split_lines(data[start:end].decode("utf-8", "replace"))
        start = end


def line_range(data: bytes, start_line: int, end_line: int, append_loc: bool) -> str:
    """Lines `start_line`..`end_line` (1-based, -1: to the end), at most READ_MAX bytes."""
    result: list[str] = []
    used = 0
    for lineno, line in enumerate(iter_lines(data), start=1):
        if lineno < start_line:
            continue
        if end_line != -1 and lineno > end_line:
            break
        out_line = f"{lineno}\u2192{line}\n" if append_loc else f"{line}\n"
        size_out = len(out_line.encode())
        if used + size_out > READ_MAX:
            result.append(TRUNCATED)
            break
        result.append(out_line)
        used += size_out
    return "".join(result)


class ReadFile(ServerTool):
    name = "read_file"
    display_name = "Read file"

    def definition(self) -> Json:
        return function(
            self.name,
            "Read the contents of a file. Optionally specify a 1-based line range. If append_loc "
            "is true, each line is prefixed with its line number (e.g. \"1\u2192...\").",
            {"path": prop("string", "Path to the file"),
             "start_line": prop("integer", "First line to read, 1-based (default: 1)"),
             "end_line": prop("integer", "Last line to read, 1-based inclusive (default: end of "
                              "file)"),
             "append_loc": prop("boolean", "Prefix each line with its line number")},
            ["path"])

    async def invoke(self, call: ToolCall) -> Json:
        params = call.params
        path = required(params, "path", str)
        start_line = optional(params, "start_line", 1)
        end_line = optional(params, "end_line", -1)
        append_loc = optional(params, "append_loc", False)
        size = await call.io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if call.resp_type == "base64":  # the x-resp-type header, never the model
            if size > READ_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
            try:
                data = await call.io.read_file(path, READ_MAX_BASE64)
            except FileRefused as exc:
                return {"error": str(exc)}
            if data is None:
                return {"error": f"failed to open file: {path}"}
            encoded = await call.io.offload(base64.b64encode, data)
            return {"base64": encoded.decode(), "size_bytes": len(data)}
        if size > READ_MAX and end_line == -1:
            return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use "
                             "start_line/end_line to read a portion."}
        try:
            data = await call.io.read_file(path)
        except FileRefused as exc:
            return {"error": str(exc)}
        if data is None:
            return {"error": f"failed to open file: {path}"}
        # a file may have up to FILE_READ_MAX bytes: decoded and cut in a thread
        text = await call.io.offload(line_range, data, start_line, end_line, append_loc)
        return {"plain_text_response": text}


class WriteFile(ServerTool):
    name = "write_file"
    display_name = "Write file"
    permission_write = True

    def definition(self) -> Json:
        return function(
            self.name,
            "Write content to a file, creating it (including parent directories) if it does not "
            "exist. May use with edit_file for more complex edits.",
            {"path": prop("string", "Path of the file to write"),
             "content": prop("string", "Content to write")},
            ["path", "content"])

    async def invoke(self, call: ToolCall) -> Json:
        path = required(call.params, "path", str)
        content = required(call.params, "content", str).encode()
        try:
            written = await call.io.write_file(path, content)
        except FileRefused as exc:
            return {"error": str(exc)}
        if not written:
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(content)}
