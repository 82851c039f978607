"""exec_shell_command and get_info, as llama-server's (`server-tools.cpp`): a timeout (default
10 s, at most 60) and an output cap (at most 16 KiB) on every command."""

from __future__ import annotations

from api.tools.params import optional, required
from api.tools.tool import Json, ServerTool, ToolCall, function, prop

EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT_S = 60
EXEC_DEFAULT_TIMEOUT_S = 10
INFO_MAX_OUTPUT = 4096
INFO_TIMEOUT_S = 5


def exit_tail(exit_code: int, timed_out: bool) -> str:
    return f"\n[exit code: {exit_code}]" + (" [exit due to timed out]" if timed_out else "")


class ExecShellCommand(ServerTool):
    name = "exec_shell_command"
    display_name = "Execute shell command"
    permission_write = True
    support_stream = True

    def definition(self) -> Json:
        return function(
            self.name,
            "Execute a shell command and return its output (stdout and stderr combined).",
            {"command": prop("string", "Shell command to execute"),
             "timeout": prop("integer", f"Timeout in seconds (default 10, max "
                             f"{EXEC_MAX_TIMEOUT_S})"),
             "max_output_size": prop("integer", f"Maximum output size in bytes (default "
                                     f"{EXEC_MAX_OUTPUT})")},
            ["command"])

    async def invoke(self, call: ToolCall) -> Json | None:
        command = required(call.params, "command", str)
        timeout = min(optional(call.params, "timeout", EXEC_DEFAULT_TIMEOUT_S),
                      EXEC_MAX_TIMEOUT_S)
        max_output = max(0, min(optional(call.params, "max_output_size", EXEC_MAX_OUTPUT),
                                EXEC_MAX_OUTPUT))
        args = ["sh", "-c", command]
        stream = call.stream
        if stream is not None:
            def on_chunk(chunk: str) -> bool:
                stream.push(chunk)
                return stream.alive()

            res = await call.io.run(args, max_output, timeout, on_chunk)
            if stream.alive():
                stream.push(exit_tail(res.exit_code, res.timed_out))
            return None
        res = await call.io.run(args, max_output, timeout)
        return {"plain_text_response": res.output + exit_tail(res.exit_code, res.timed_out)}


class GetInfo(ServerTool):
    name = "get_info"
    display_name = "Get Runtime Info"

    def definition(self) -> Json:
        return {"type": "function", "function": {
            "name": self.name,
            "description": "Returns runtime info: the OS name/version and the current working "
                           "directory",
            "parameters": {"type": "object", "properties": {}}}}

    async def invoke(self, call: ToolCall) -> Json:
        res = await call.io.run(["uname", "-a"], INFO_MAX_OUTPUT, INFO_TIMEOUT_S)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = call.cwd
        if not cwd and not call.io.is_isolate:
            cwd = call.io.resolve(".")  # the pod's working directory (or --tools-root)
        elif not cwd:
            pwd = await call.io.run(["pwd"], INFO_MAX_OUTPUT, INFO_TIMEOUT_S)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}
