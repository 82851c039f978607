"""MCP servers over stdio on a real api pod, against real MCP servers (tests/mcp_servers/:
one written with the official `mcp` SDK, others that misbehave): tools listed as
`<server>_<tool>` beside the built-in ones, called, timed out, respawned after a crash; a
server that cannot start, writes garbage or never answers `initialize` costs its own tools
only; the pod's event loop stays free; a bad config stops the start; a pod stopped during a
call exits within 3 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.paths import TESTS
from tests.processes import Fleet, free_port

SERVERS = TESTS / "mcp_servers"
ECHO = [str(SERVERS / "echo_server.py")]


def mcp_json(servers: dict[str, dict[str, Any]]) -> str:
    return json.dumps({"mcpServers": servers})


def echo_server(**more: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": ECHO, **more}


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = tools_fleet(redis_url, tmp_path_factory.mktemp("mcp"), "mcp")
    servers = mcp_json({
        # the SDK's import takes seconds on a loaded machine: timeout_ms bounds the warm-up
        "echo": echo_server(timeout_ms=8000, env={"MCP_TEST_VALUE": "from-config"},
                            cwd=str(SERVERS)),
        "echo2": echo_server(),
        "nonexistent": {"command": "this_executable_does_not_exist_12345"},
        "garbage": {"command": sys.executable, "args": [str(SERVERS / "garbage_server.py")],
                    "timeout_ms": 1000},
        "silent": {"command": sys.executable, "args": [str(SERVERS / "silent_server.py")],
                   "timeout_ms": 1000},
        # a name that the built-in read_file takes: skipped
        "read": echo_server(),
    })
    fleet.add_api("--tools", "read_file", "--mcp-servers-json", servers)
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def api(fleet: Fleet) -> str:
    return fleet.api_urls[0]


def call(api: str, tool: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    res = httpx.post(f"{api}/tools", json={"tool": tool, "params": params or {}}, timeout=30)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    return body


def test_listing(api: str) -> None:
    tools = {t["tool"]: t for t in httpx.get(f"{api}/tools").json()}
    assert {"echo_echo", "echo_add", "echo2_echo", "echo2_add", "read_file"} <= set(tools)
    assert not any(n.startswith(("nonexistent_", "garbage_", "silent_")) for n in tools)
    echo = tools["echo_echo"]
    assert echo["type"] == "mcp" and echo["display_name"] == "echo_echo"
    assert echo["permissions"] == {"write": False} and echo["uses_cwd"] is False
    function = echo["definition"]["function"]
    assert echo["definition"]["type"] == "function" and function["name"] == "echo_echo"
    assert function["description"] == "Echo a message back."
    assert function["parameters"]["type"] == "object"
    assert function["parameters"]["properties"]["message"]["type"] == "string"
    # the server "read" has a tool "file": read_file is the built-in one, read_echo is MCP's
    assert tools["read_file"]["type"] == "server" and tools["read_echo"]["type"] == "mcp"
    assert "plain_text_response" in call(api, "read_file", {"path": str(SERVERS / "__init__.py")})


def test_calls(api: str) -> None:
    assert call(api, "echo_echo", {"message": "hello world"}) == \
        {"plain_text_response": "hello world"}
    assert call(api, "echo_add", {"a": 3, "b": 5}) == {"plain_text_response": "8"}
    assert call(api, "echo_whoami")["plain_text_response"].startswith(
        f"from-config|{SERVERS}|")  # env and cwd from the config
    error = call(api, "echo_echo", {})["error"]
    assert "message" in error and "Field required" in error  # the server's own error
    res = httpx.post(f"{api}/tools", json={"tool": "echo_echo", "stream": True})
    assert res.status_code == 404 and "does not support stream" in res.json()["message"]


def test_one_process_serves_the_calls_and_fail_once_recovers(api: str) -> None:
    pids = {call(api, "echo_whoami")["plain_text_response"].split("|")[2] for _ in range(5)}
    assert len(pids) == 1  # spawned on demand once, then kept
    first = call(api, "echo2_fail_once")
    second = call(api, "echo2_fail_once")
    assert first == {"error": "Error executing tool fail_once"}
    assert second == {"plain_text_response": "ok"}


def test_concurrent_calls(api: str) -> None:
    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda i: call(api, "echo_echo", {"message": f"m{i}"}),
                                range(10)))
    assert results == [{"plain_text_response": f"m{i}"} for i in range(10)]


def test_timeout_then_the_pod_still_answers(api: str) -> None:
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(call, api, "echo_sleep", {"seconds": 30})
        time.sleep(0.5)
        quick = time.monotonic()
        assert httpx.get(f"{api}/tools").status_code == 200  # the loop is not blocked
        assert call(api, "echo2_echo", {"message": "x"}) == {"plain_text_response": "x"}
        assert time.monotonic() - quick < 4
        assert slow.result() == {"error": "request timed out"}  # timeout_ms 8000
    assert 7.5 < time.monotonic() - started < 15


def test_crash_respawns(api: str) -> None:
    before = call(api, "echo_whoami")["plain_text_response"].split("|")[2]
    crashed = call(api, "echo_crash")
    assert "error" in crashed
    after = call(api, "echo_whoami")["plain_text_response"].split("|")[2]
    assert after != before


def test_servers_that_never_started(api: str) -> None:
    # their tools were never listed, so a call names an unknown tool
    res = httpx.post(f"{api}/tools", json={"tool": "garbage_x", "params": {}})
    assert res.status_code == 404


@pytest.mark.parametrize(("args", "message"), [
    (["--mcp-servers-json", "not valid json"], "failed to parse MCP config JSON"),
    (["--mcp-servers-config", "/nonexistent/path.json"],
     "failed to open MCP config file: /nonexistent/path.json"),
    (["--tools", "no_such_tool"], 'unknown tool "no_such_tool". available tools: read_file'),
    (["--tools", "all", "--tools-runtime", "lxc:x"], "--tools-runtime: unknown tool runtime"),
    (["--tools", "all", "--tools-root", "/nonexistent/root"],
     "--tools-root: not a directory: /nonexistent/root"),
])
def test_bad_config_stops_the_start(fleet: Fleet, args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "llamaq", "api", "--port", str(free_port()),
                           *args], capture_output=True, text=True, timeout=60,
                          cwd=fleet.workdir, env={**os.environ, "LLAMAQ_REDIS_URL":
                                                  fleet.redis_url})
    assert done.returncode != 0
    assert f"llamaq api: {message}" in done.stderr, done.stderr


def test_config_file_and_stop_during_a_call(fleet: Fleet, tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(mcp_json({"slow": echo_server(timeout_ms=30000)}))
    url = fleet.add_api("--mcp-servers-config", str(config))
    process = fleet.processes[-1]
    assert "slow_sleep" in [t["tool"] for t in httpx.get(f"{url}/tools").json()]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{url}/tools", json={
            "tool": "slow_sleep", "params": {"seconds": 20}}, timeout=30)
        time.sleep(2)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        assert time.monotonic() - started < 3
        try:
            answer = pending.result()
        except httpx.HTTPError:
            pass  # the connection closed with the pod
        else:
            assert answer.status_code == 200 and "error" in answer.json()
