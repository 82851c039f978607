"""The parts of api/tools/ that start no process: glob rules, parameter reading, edit_file's
matching, --tools-root confinement (symlink and `..` escapes), the call body, the MCP config,
runtimes, the CORS proxy's checks, and the flags that turn the feature on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from api.cors import effective_origins
from api.endpoints.tools.protocol import read_call
from api.settings import ApiSettings
from api.tools.builtin.catalog import BUILTIN_NAMES, select
from api.tools.builtin.edit_file import EditFile, normalize
from api.tools.builtin.read_write import ReadFile, WriteFile
from api.tools.cors_proxy import ProxyRefused, check_target, forwarded_headers
from api.tools.errors import ToolArgumentError, ToolRuntimeError, ToolRuntimeForbidden
from api.tools.glob_match import glob_match, path_glob_match
from api.tools.host_io import HostIO
from api.tools.mcp_config import load_mcp_configs, parse_mcp_json
from api.tools.params import optional, required
from api.tools.paths import Confinement, OutsideRootError
from api.tools.runtime import check_header_runtime, check_runtime_flag, make_io
from api.tools.ssh_io import SshIO
from api.tools.tool import ToolCall


def run(tool: object, params: dict[str, object], io: HostIO) -> dict[str, object]:
    result = asyncio.run(tool.invoke(ToolCall(params, io)))  # type: ignore[attr-defined]
    assert isinstance(result, dict)
    return result


def test_glob_rules_are_llama_cpps() -> None:
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "d/a.py")
    assert glob_match("**/*.py", "d/e/a.py") and glob_match("**", "x/y")
    assert glob_match("a?c", "abc") and not glob_match("a?c", "a/c")
    assert glob_match("[a-c]x", "bx") and not glob_match("[!a-c]x", "bx")
    assert path_glob_match("*.py", "deep/down/a.py")  # no '/': the basename at any depth
    assert path_glob_match("src/*.cpp", "x/src/m.cpp")  # '/': auto-anchored with **/
    assert not path_glob_match("src/*.cpp", "src/d/m.cpp")


def test_parameters_read_as_nlohmann_reads_them() -> None:
    with pytest.raises(ToolArgumentError, match=r"key 'path' not found"):
        required({}, "path", str)
    with pytest.raises(ToolArgumentError, match="type must be string, but is number"):
        required({"path": 3}, "path", str)
    assert optional({"limit": "x"}, "limit", 100) == 100  # the wrong type: the default
    assert optional({"limit": 2.9}, "limit", 100) == 2
    assert optional({"flag": 1}, "flag", False) is False


def test_call_body_errors() -> None:
    assert read_call(b'{"tool":"get_info"}').params == {}
    for raw, message in ((b"{", "parse error"), (b"[]", r"cannot use at\(\) with array"),
                         (b"{}", "key 'tool' not found"), (b'{"tool":1}', "must be string"),
                         (b'{"tool":"x","stream":"yes"}', "must be boolean")):
        with pytest.raises(ToolArgumentError, match=message):
            read_call(raw)


def test_tools_flag_names_are_checked() -> None:
    assert [t.name for t in select(["all"])] == list(BUILTIN_NAMES)
    assert [t.name for t in select(["get_info", "read_file"])] == ["read_file", "get_info"]
    with pytest.raises(ValueError, match=r'unknown tool "nope"\. available tools: read_file'):
        select(["nope"])


def test_edit_file_exact_fuzzy_unique_overlap(tmp_path: Path) -> None:
    io = HostIO(str(tmp_path))
    (tmp_path / "f.txt").write_text("a = \u201cx\u201d   \nb = 1\nb = 1\nend\n")
    edit = EditFile()
    # a smart-quoted line with trailing spaces is found from its ASCII form
    res = run(edit, {"path": "f.txt", "edits": [{"old_text": 'a = "x"', "new_text": "a = 2"}]},
              io)
    assert res == {"result": "file edited successfully", "path": "f.txt", "edits_applied": 1}
    assert (tmp_path / "f.txt").read_text() == "a = 2\nb = 1\nb = 1\nend\n"
    dup = run(edit, {"path": "f.txt", "edits": [{"old_text": "b = 1", "new_text": "c"}]}, io)
    assert "found 2 occurrences" in str(dup["error"]) and "must be unique" in str(dup["error"])
    over = run(edit, {"path": "f.txt", "edits": [{"old_text": "a = 2\nb", "new_text": "x"},
                                                 {"old_text": "2\nb = 1\nb", "new_text": "y"}]},
               io)
    assert "overlap" in str(over["error"])
    same = run(edit, {"path": "f.txt", "edits": [{"old_text": "end", "new_text": "end"}]}, io)
    assert same["error"] == "no changes made: the replacement(s) produced identical content"
    assert run(edit, {"path": "f.txt", "edits": []}, io)["error"] == \
        '"edits" must be a non-empty array'
    assert normalize("x\u00a0\u2014 \t") == "x -"


def test_read_file_ranges_and_limits(tmp_path: Path) -> None:
    io = HostIO(str(tmp_path))
    (tmp_path / "l.txt").write_text("one\ntwo\nthree\n")
    res = run(ReadFile(), {"path": "l.txt", "start_line": 2, "end_line": 3, "append_loc": True},
              io)
    assert res == {"plain_text_response": "2\u2192two\n3\u2192three\n"}
    (tmp_path / "big.txt").write_text("x" * 20000)
    assert "file too large (20000 bytes, max 16384)" in str(run(ReadFile(), {"path": "big.txt"},
                                                                io)["error"])
    assert run(ReadFile(), {"path": "none.txt"}, io) == {"error": "cannot stat file: none.txt"}


def test_tools_root_refuses_dotdot_and_symlink_escapes(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "ok.txt").write_text("fine")
    os.symlink(outside / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    io = HostIO("", Confinement(str(root)))
    assert run(ReadFile(), {"path": "ok.txt"}, io) == {"plain_text_response": "fine\n"}
    for path in ("../outside/secret.txt", str(outside / "secret.txt"), "link.txt",
                 "linkdir/secret.txt", "~/x"):
        with pytest.raises(OutsideRootError, match="outside the tools root"):
            run(ReadFile(), {"path": path}, io)
    with pytest.raises(OutsideRootError):  # a new file through a symlinked folder
        run(WriteFile(), {"path": "linkdir/new.txt", "content": "x"}, io)
    assert not (outside / "new.txt").exists()
    assert run(WriteFile(), {"path": "sub/new.txt", "content": "x"}, io)["bytes"] == 1
    assert Confinement(None).check("/etc/passwd") == "/etc/passwd"  # none: llama-server's


def test_runtimes_are_refused_by_name() -> None:
    for spec, message in (("fake:x", "unknown tool runtime: fake:x"),
                          ("ssh:-oProxyCommand=x", "invalid ssh target"),
                          ("podman-container:--privileged", "invalid container id"),
                          ("docker:busybox", "must name a running container")):
        with pytest.raises(ToolRuntimeError, match=message):
            make_io(spec, "", Confinement())
    assert make_io("podman-container:abc123", "/tmp", Confinement()).is_isolate
    ssh = make_io("ssh:me@host", "/srv", Confinement(), "/etc/llamaq/ssh_config")
    assert isinstance(ssh, SshIO) and ssh.is_isolate
    assert ssh.argv(["sh", "-c", 'wc -c < "$1"', "_", "/srv/a b"]) == [
        "ssh", "-F", "/etc/llamaq/ssh_config", "-o", "BatchMode=yes",
        "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
        "-o", "StrictHostKeyChecking=yes", "-n", "me@host",
        """sh -c 'wc -c < "$1"' _ '/srv/a b'"""]  # one word the remote shell parses back
    check_runtime_flag("podman:busybox")
    with pytest.raises(ValueError, match="requires an image name"):
        check_runtime_flag("podman:")
    with pytest.raises(ValueError, match="unknown tool runtime"):
        check_runtime_flag("lxc:x")


def test_a_runtime_header_names_only_what_the_operator_allowed() -> None:
    check_header_runtime("", "", "", [])  # no header: the pod's own runtime
    check_header_runtime("podman-container:a1", "podman-container:a1", "", [])
    check_header_runtime("podman-container:c9", "podman:img", "podman-container:c9", [])
    check_header_runtime("docker-container:x", "", "", ["docker-container:*"])
    check_header_runtime("docker-container:x", "", "", ["docker-container:x"])
    for header, allow in (("docker-container:redis", []), ("podman-container:x", []),
                          ("podman-container:x", ["docker-container:*"]),
                          ("docker-container:xy", ["docker-container:x"]),
                          ("ssh:user@host", ["podman-container:*"])):
        with pytest.raises(ToolRuntimeForbidden, match="tool runtime not allowed"):
            check_header_runtime(header, "podman:img", "podman-container:c9", allow)


def test_mcp_config(tmp_path: Path) -> None:
    servers = parse_mcp_json('{"mcpServers": {"a": {"command": "x", "args": ["1"], "env": '
                             '{"K": "V"}, "timeout_ms": 500}, "nocmd": {"args": []}}}')
    assert [(s.name, s.args, s.env, s.timeout_ms) for s in servers] == \
        [("a", ["1"], {"K": "V"}, 500)]
    assert parse_mcp_json('{"other": 1}') == []
    with pytest.raises(ValueError, match="failed to parse MCP config JSON"):
        parse_mcp_json("not valid json")
    with pytest.raises(ValueError, match="failed to open MCP config file"):
        load_mcp_configs(str(tmp_path / "missing.json"), None)
    path = tmp_path / "c.json"
    path.write_text('{"mcpServers": {"a": {"command": "file"}}}')
    both = load_mcp_configs(str(path), '{"mcpServers": {"a": {"command": "inline"}, "b": '
                            '{"command": "y"}}}')
    assert [(s.name, s.command) for s in both] == [("a", "file"), ("b", "y")]


def test_cors_proxy_checks() -> None:
    for url, message in (("ftp://x/", "unsupported URL scheme: ftp"),
                         ("http://u:p@h/", "authentication in target URL"),
                         ("http://u@h/", "authentication in target URL"),
                         ("127.0.0.1:80/", "no scheme")):
        with pytest.raises(ProxyRefused, match=message):
            check_target(url)
    assert check_target("http://127.0.0.1:8080/mcp") == "http://127.0.0.1:8080/mcp"
    assert forwarded_headers({"X-Llama-Server-Proxy-Header-Authorization": "Bearer t",
                              "Authorization": "Bearer mine", "Cookie": "c",
                              "x-llama-server-proxy-header-content-length": "9"}) == \
        {"Authorization": "Bearer t"}


def test_tools_and_mcp_default_cors_to_localhost() -> None:
    def settings(*args: str) -> ApiSettings:
        return ApiSettings.from_args(list(args), {})

    assert effective_origins(settings("--tools", "all")) == ["localhost"]
    assert effective_origins(settings("--agent")) == ["localhost"]
    assert effective_origins(settings("--mcp-servers-json", "{}")) == ["localhost"]
    assert effective_origins(settings("--ui-mcp-proxy")) == ["*"]  # the proxy alone: no
    assert effective_origins(settings("--tools", "all", "--cors-origins", "*")) == ["*"]
    assert settings("--agent").enabled_tools() == ["all"]
    assert settings("--agent").cors_proxy_on()
