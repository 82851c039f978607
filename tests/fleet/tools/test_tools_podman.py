"""Tools in podman containers on a real api pod: `x-tool-runtime: podman-container:ID` runs
the file tools and commands in a running container; `--tools-runtime podman:IMAGE` spawns one
container for the pod, reuses it, and removes it when the pod stops. Skipped where podman or
the compose test's base image (scripts/compose-test builds it) is missing; podman runs as this
machine allows it (runc, cgroupfs, no default ulimits: scripts/compose-test)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.processes import Fleet

IMAGE = "localhost/llamaq-debian:bookworm"
CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {"CONTAINERS_CONF": str(conf)}
    probe = subprocess.run(["podman", "run", "--rm", IMAGE, "true"], capture_output=True,
                           text=True, timeout=60, env={**dict(os.environ), **env})
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run {IMAGE}: {probe.stderr.strip()[:200]}")
    return env


def podman(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60,
                          env={**dict(os.environ), **env})


def post(api: str, tool: str, params: dict[str, Any],
         headers: dict[str, str] | None = None) -> dict[str, Any]:
    res = httpx.post(f"{api}/tools", json={"tool": tool, "params": params},
                     headers=headers or {}, timeout=60)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    assert "error" not in body, body
    return body


@pytest.fixture(scope="module")
def container(podman_env: dict[str, str]) -> Iterator[str]:
    started = podman(podman_env, "run", "-d", "--rm", IMAGE, "sleep", "300")
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip()
    yield cid
    podman(podman_env, "rm", "-f", "-t", "0", cid)


def test_attach_to_a_running_container(redis_url: str, tmp_path: Path,
                                       podman_env: dict[str, str], container: str) -> None:
    fleet: Fleet = tools_fleet(redis_url, tmp_path, "podman-attach")
    fleet.env.update(podman_env)
    api = fleet.add_api("--tools", "all", "--tools-runtime-allow", "podman-container:*")
    try:
        headers = {"x-tool-runtime": f"podman-container:{container}", "x-tool-cwd": "/tmp"}
        assert post(api, "write_file", {"path": "sub/test.log", "content": "hello container\n"},
                    headers)["result"] == "file written successfully"
        assert not (Path("/tmp") / "sub" / "test.log").exists()  # not on the host
        assert post(api, "read_file", {"path": "sub/test.log"}, headers) == \
            {"plain_text_response": "hello container\n"}
        shell = post(api, "exec_shell_command", {"command": "cat sub/test.log; hostname"},
                     headers)["plain_text_response"]
        assert "hello container" in shell and container[:12] in shell
        found = post(api, "file_glob_search", {"path": ".", "include": "*.log"}, headers)
        assert [e["path"] for e in found["entries"]] == ["sub/test.log"]
        assert post(api, "get_info", {}, headers)["cwd"] == "/tmp"
        slow = post(api, "exec_shell_command", {"command": "sleep 30", "timeout": 1}, headers)
        assert "[exit code: 124]" in slow["plain_text_response"]  # the container's timeout
    finally:
        fleet.stop()


def test_owned_container_is_reused_and_removed(redis_url: str, tmp_path: Path,
                                               podman_env: dict[str, str]) -> None:
    fleet: Fleet = tools_fleet(redis_url, tmp_path, "podman-owned")
    fleet.env.update(podman_env)
    api = fleet.add_api("--tools", "all", "--tools-runtime", f"podman:{IMAGE}")
    try:
        first = post(api, "exec_shell_command", {"command": "hostname"})
        second = post(api, "exec_shell_command", {"command": "hostname"})
        host = first["plain_text_response"].splitlines()[0].strip()
        assert second["plain_text_response"].splitlines()[0].strip() == host  # reused
        running = podman(podman_env, "inspect", "-f", "{{.State.Running}}", host)
        assert running.stdout.strip() == "true", running.stderr
    finally:
        fleet.stop()
    assert podman(podman_env, "inspect", host).returncode != 0  # removed with the pod
