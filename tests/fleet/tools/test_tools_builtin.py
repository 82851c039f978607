"""GET/POST /tools with the built-in tools on a real api pod (--tools all, router mode, an API
key), against real files in a temporary folder: llama-server's shapes and errors
(`server-tools.cpp`, its tests in tools/server/tests/unit/test_tools_builtin.py), the 403 of a
pod without tools, the key guard, the localhost CORS default, exec_shell_command's stream,
timeout and cap, and the call log (the key's id, never the key)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import api_log, tools_fleet
from tests.processes import Fleet

KEY = "tools-test-key-5f1c"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = tools_fleet(redis_url, tmp_path_factory.mktemp("tools"), "tools")
    fleet.add_api("--tools", "all", "--api-key", KEY)
    fleet.add_api()  # no tools: /tools is 403
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def api(fleet: Fleet) -> str:
    return fleet.api_urls[0]


def post(api: str, tool: str, params: dict[str, Any], headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:
    return httpx.post(f"{api}/tools", json={"tool": tool, "params": params, **body},
                      headers={**AUTH, **(headers or {})}, timeout=30)


def call(api: str, tool: str, params: dict[str, Any],
         headers: dict[str, str] | None = None) -> dict[str, Any]:
    res = post(api, tool, params, headers)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    assert "error" not in body, body
    return body


def call_error(api: str, tool: str, params: dict[str, Any]) -> str:
    res = post(api, tool, params)
    assert res.status_code == 200, res.text
    return str(res.json()["error"])


def stream(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", f"{api}/tools", json=body, headers=AUTH, timeout=30) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        for line in res.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def test_listing_shape(api: str) -> None:
    tools = httpx.get(f"{api}/tools", headers=AUTH).json()
    assert [t["tool"] for t in tools] == ["read_file", "file_glob_search", "grep_search",
                                          "exec_shell_command", "write_file", "edit_file",
                                          "get_info"]
    shell = tools[3]
    assert shell == {"display_name": "Execute shell command", "tool": "exec_shell_command",
                     "type": "server", "permissions": {"write": True}, "uses_cwd": True,
                     "definition": shell["definition"]}
    function = shell["definition"]["function"]
    assert shell["definition"]["type"] == "function"
    assert function["parameters"]["required"] == ["command"]
    assert set(function["parameters"]["properties"]) == {"command", "timeout",
                                                         "max_output_size"}


def test_disabled_pod_answers_403(fleet: Fleet) -> None:
    plain = fleet.api_urls[1]
    for res in (httpx.get(f"{plain}/tools"),
                httpx.post(f"{plain}/tools", json={"tool": "get_info"}),
                httpx.get(f"{plain}/cors-proxy", params={"url": "http://127.0.0.1/"})):
        assert res.status_code == 403
        assert res.json() == {"error": {"message": "this feature is disabled",
                                        "type": "feature_disabled"}}


def test_api_key_guards_tools(api: str) -> None:
    assert httpx.get(f"{api}/tools").status_code == 401
    res = httpx.post(f"{api}/tools", json={"tool": "exec_shell_command",
                                          "params": {"command": "echo pwned"}})
    assert res.status_code == 401 and "pwned" not in res.text


def test_cors_defaults_to_localhost(fleet: Fleet, api: str) -> None:
    local = httpx.get(f"{api}/tools", headers={**AUTH, "Origin": "http://localhost:5173"})
    assert local.headers["access-control-allow-origin"] == "http://localhost:5173"
    evil = httpx.get(f"{api}/tools", headers={**AUTH, "Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in evil.headers
    plain = httpx.get(f"{fleet.api_urls[1]}/health", headers={"Origin": "http://evil.example"})
    # no tools: the default (`*`, with credentials: the origin echoed)
    assert plain.headers["access-control-allow-origin"] == "http://evil.example"


def test_request_errors(api: str) -> None:
    bad_json = httpx.post(f"{api}/tools", content=b"{nope",
                          headers={**AUTH, "Content-Type": "application/json"})
    assert bad_json.status_code == 400
    assert bad_json.json()["type"] == "invalid_request_error"
    assert bad_json.json()["code"] == 400 and "error" not in bad_json.json()
    missing = post(api, "read_file", {})
    assert missing.status_code == 400
    assert missing.json() == {"code": 400, "type": "invalid_request_error",
                              "message": "[json.exception.out_of_range.403] key 'path' not found"}
    unknown = post(api, "no_such_tool", {})
    assert unknown.status_code == 404
    assert unknown.json() == {"code": 400, "type": "invalid_request_error",
                              "message": 'unknown tool "no_such_tool"'}
    no_stream = post(api, "read_file", {"path": "x"}, stream=True)
    assert no_stream.status_code == 404
    assert no_stream.json()["message"] == 'tool "read_file" does not support stream = true'


def test_runtime_header_must_be_allowed(api: str, tmp_path: Path) -> None:
    """ours (issue 43): without --tools-runtime-allow a caller names no runtime: a container
    the pod can reach (a worker, Redis) is a 403 `permission_error`, and nothing runs."""
    marker = tmp_path / "ran"
    for runtime in ("docker-container:redis", "podman-container:llamaq-worker-1",
                    "fake:does-not-exist", "ssh:someone@host", "docker:busybox"):
        for stream in (False, True):
            res = post(api, "exec_shell_command", {"command": f"touch {marker}"},
                       {"x-tool-runtime": runtime}, stream=stream)
            assert res.status_code == 403, res.text
            assert res.json() == {"code": 403, "type": "permission_error", "message":
                                  f"tool runtime not allowed: {runtime} (the operator's "
                                  "--tools-runtime-allow does not list it)"}
    assert not marker.exists()


def test_allowed_runtime_header_errors_are_500(fleet: Fleet) -> None:
    """A header --tools-runtime-allow lets through is parsed as llama-server parses it."""
    allowing = fleet.add_api("--tools", "all", "--api-key", KEY, "--tools-runtime-allow",
                             "fake:*,ssh:*,docker-container:*,podman-container:*")
    for runtime, message in (("fake:does-not-exist", "unknown tool runtime"),
                             ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
                             ("docker-container:--privileged", "invalid container id"),
                             ("podman-container:--privileged", "invalid container id")):
        res = post(allowing, "exec_shell_command", {"command": "echo hi"},
                   {"x-tool-runtime": runtime})
        assert res.status_code == 500, res.text
        assert res.json()["type"] == "server_error" and message in res.json()["message"]


def test_grep_read_write_edit(api: str, tmp_path: Path) -> None:
    marker = "llamaq_tools_marker_grep"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text(f"x = 1\n# {marker}\n")
    (tmp_path / "b.txt").write_text(f"{marker}\n")
    text = call(api, "grep_search", {"path": str(tmp_path), "pattern": marker,
                                     "include": "*.py", "return_line_numbers": True}
                )["plain_text_response"]
    assert f"src/a.py:2:# {marker}" in text and "Total matches: 1" in text
    log = str(tmp_path / "t.log")
    assert call(api, "write_file", {"path": log, "content": "line1\nline2\nline3\n"}) == \
        {"result": "file written successfully", "path": log, "bytes": 18}
    assert call(api, "read_file", {"path": log})["plain_text_response"] == \
        "line1\nline2\nline3\n"
    edited = call(api, "edit_file", {"path": log, "edits": [
        {"old_text": "line2", "new_text": "line2-edited"},
        {"old_text": "line3\n", "new_text": "line3\nline4\n"}]})
    assert edited["edits_applied"] == 2
    assert Path(log).read_text() == "line1\nline2-edited\nline3\nline4\n"
    Path(log).write_text("dup\ndup\n")
    assert "unique" in call_error(api, "edit_file", {"path": log, "edits": [
        {"old_text": "dup", "new_text": "x"}]})
    assert call_error(api, "read_file", {"path": str(tmp_path / "none")}) == \
        f"cannot stat file: {tmp_path / 'none'}"
    assert call_error(api, "grep_search", {"path": str(tmp_path), "pattern": "("}
                      ).startswith("invalid regex: ")


def test_file_glob_search(api: str, tmp_path: Path) -> None:
    (tmp_path / "project-alpha" / "src").mkdir(parents=True)
    (tmp_path / "project-alpha" / "README.md").write_text("alpha")
    (tmp_path / "project-alpha" / "src" / "main.cpp").write_text("int main() {}")
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("built")
    dirs = call(api, "file_glob_search", {"path": str(tmp_path), "type": "dir"})
    assert "project-alpha/src/" in dirs["plain_text_response"]
    assert "README.md" not in dirs["plain_text_response"]
    assert {e["path"]: e["type"] for e in dirs["entries"]}["project-alpha/src"] == "dir"
    assert dirs["base"] == str(tmp_path)
    everything = [e["path"] for e in call(api, "file_glob_search", {"path": str(tmp_path),
                                                                    "type": "all"})["entries"]]
    assert "project-alpha/src/main.cpp" in everything and "build" in everything
    assert "build/artifact.txt" not in everything  # a junk folder is never walked
    limited = call(api, "file_glob_search", {"path": str(tmp_path), "limit": 1})
    assert len(limited["entries"]) == 1
    assert "[1 results limit reached (2 total matches)" in limited["plain_text_response"]
    shallow = call(api, "file_glob_search", {"path": str(tmp_path), "max_depth": 2})
    assert [e["path"] for e in shallow["entries"]] == ["project-alpha/README.md"]
    assert "invalid type" in call_error(api, "file_glob_search", {"path": str(tmp_path),
                                                                  "type": "bogus"})
    assert call_error(api, "file_glob_search", {"path": str(tmp_path / "no")}) == \
        f"path does not exist or is not a directory: {tmp_path / 'no'}"


def test_cwd_header(api: str, tmp_path: Path) -> None:
    work = tmp_path / "workdir"
    work.mkdir()
    (work / "rel.txt").write_text("relative-content")
    headers = {"x-tool-cwd": str(work)}
    res = call(api, "read_file", {"path": "rel.txt", "cwd": "/not/real"}, headers)
    assert res["plain_text_response"] == "relative-content\n"  # the header beats the model
    call(api, "write_file", {"path": "sub/out.txt", "content": "written"}, headers)
    assert (work / "sub" / "out.txt").read_text() == "written"
    call(api, "exec_shell_command", {"command": "echo hello > marker.txt"}, headers)
    assert (work / "marker.txt").read_text() == "hello\n"
    assert call(api, "get_info", {}, headers)["cwd"] == str(work)


def test_exec_stream(api: str) -> None:
    events = stream(api, {"tool": "exec_shell_command", "stream": True,
                          "params": {"command": "echo hello; sleep 0.3; echo world"}})
    assert events[-1] == {"done": True}
    chunks = "".join(e["chunk"] for e in events[:-1])
    assert chunks == "hello\nworld\n\n[exit code: 0]"
    assert len(events) >= 3  # the output came as it was written, not at the end
    bad = stream(api, {"tool": "exec_shell_command", "stream": True, "params": {}})
    assert bad == [{"done": True, "error": "[json.exception.out_of_range.403] key 'command' "
                                           "not found"}]


def test_exec_timeout_cap_and_exit_code(api: str) -> None:
    started = time.monotonic()
    res = call(api, "exec_shell_command", {"command": "echo start; sleep 30", "timeout": 1})
    assert time.monotonic() - started < 5
    assert res["plain_text_response"] == "start\n\n[exit code: 1] [exit due to timed out]"
    capped = call(api, "exec_shell_command", {"command": "yes | head -c 100000",
                                              "max_output_size": 1000})
    assert capped["plain_text_response"] == "y\n" * 500 + "\n[output truncated]\n[exit code: 0]"
    huge = call(api, "exec_shell_command", {"command": "yes | head -c 100000",
                                            "max_output_size": 10**9})
    assert len(huge["plain_text_response"]) < 16 * 1024 + 64  # capped at 16 KiB whatever asked
    assert call(api, "exec_shell_command", {"command": "exit 7"})["plain_text_response"] == \
        "\n[exit code: 7]"
    started = time.monotonic()  # a background child does not hold the call open
    call(api, "exec_shell_command", {"command": "sleep 30 & echo bg"})
    assert time.monotonic() - started < 5
    started = time.monotonic()  # nor does endless output keep it past its timeout
    endless = call(api, "exec_shell_command", {"command": "yes", "timeout": 1})
    assert time.monotonic() - started < 5
    assert endless["plain_text_response"].endswith(
        "\n[output truncated]\n[exit code: 1] [exit due to timed out]")


@pytest.mark.serial  # an answer within 1 s: alone (tests/lanes.py)
def test_a_long_command_does_not_block_the_pod(api: str) -> None:
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(call, api, "exec_shell_command", {"command": "sleep 3; echo done"})
        time.sleep(0.5)
        started = time.monotonic()
        assert httpx.get(f"{api}/tools", headers=AUTH).status_code == 200
        assert time.monotonic() - started < 1
        assert "done" in slow.result()["plain_text_response"]


def test_a_client_that_leaves_stops_the_command(api: str, tmp_path: Path) -> None:
    marker = tmp_path / "late.txt"
    body = {"tool": "exec_shell_command", "stream": True,
            "params": {"command": f"echo go; sleep 2; echo late > {marker}", "timeout": 30}}
    with httpx.stream("POST", f"{api}/tools", json=body, headers=AUTH, timeout=30) as res:
        next(res.iter_lines())
    time.sleep(3)
    assert not marker.exists()


def test_calls_are_logged_with_the_key_id(fleet: Fleet, api: str) -> None:
    call(api, "get_info", {})
    log = api_log(fleet)
    assert "tool call: key=key-" in log and "tool=get_info" in log
    assert KEY not in log
