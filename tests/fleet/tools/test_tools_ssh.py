"""Tools over ssh on a real api pod (`--tools-runtime ssh:TARGET`, llama-server's
`tools_io_ssh`): a real sshd (Debian's openssh-server, `scripts/install test`) on a free local
port with a host key and a client key of this test's own; the pod's ssh config
(--tools-ssh-config) names the target's port, key and known_hosts. The file tools and commands
run through ssh; a host key the pod does not trust is refused (StrictHostKeyChecking), never
prompted for."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet

pytestmark = pytest.mark.process
SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def keygen(path: Path) -> str:
    """A key pair at `path` (private) and `path`.pub; returns the public one."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A sshd on a free port; returns an ssh config that reaches it as `llamaq-ssh` (and
    `llamaq-ssh-untrusted`, with an empty known_hosts)."""
    root = tmp_path_factory.mktemp("sshd")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    host_key = keygen(root / "host_key").split()
    client_key = keygen(root / "client")
    (root / "authorized_keys").write_text(client_key + "\n")
    port = free_port()
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_key'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "StrictModes no\nPermitRootLogin prohibit-password\n")
    home = root / "client-files"
    home.mkdir()
    (home / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    (home / "untrusted_hosts").write_text("")
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout
    config = ""
    for name, known in (("llamaq-ssh", "known_hosts"), ("llamaq-ssh-untrusted",
                                                        "untrusted_hosts")):
        config += (f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {user.strip()}\n"
                   f"  IdentityFile {root / 'client'}\n  UserKnownHostsFile {home / known}\n"
                   "  IdentitiesOnly yes\n")
    (home / "config").write_text(config)
    (home / "config").chmod(0o600)
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                              stderr=(root / "sshd.log").open("w"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert server.poll() is None, (root / "sshd.log").read_text()
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield home / "config"
    server.terminate()
    server.wait(10)


def post(api: str, tool: str, params: dict[str, Any],
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{api}/tools", json={"tool": tool, "params": params},
                      headers=headers or {}, timeout=60)


def test_tools_run_on_the_ssh_target(redis_url: str, tmp_path: Path,
                                     sshd: Path) -> None:
    remote = tmp_path / "remote"  # the target is this machine: its files are ours to check
    remote.mkdir()
    fleet = tools_fleet(redis_url, tmp_path, "ssh")
    api = fleet.add_api("--tools", "all", "--tools-runtime", "ssh:llamaq-ssh",
                        "--tools-ssh-config", str(sshd),
                        "--tools-runtime-allow", "ssh:llamaq-ssh-untrusted")
    try:
        cwd = {"x-tool-cwd": str(remote)}
        written = post(api, "write_file", {"path": "sub/a.log", "content": "over ssh\n"}, cwd)
        assert written.status_code == 200 and "error" not in written.json(), written.text
        assert (remote / "sub" / "a.log").read_text() == "over ssh\n"
        assert post(api, "read_file", {"path": "sub/a.log"}, cwd).json() == \
            {"plain_text_response": "over ssh\n"}
        shell = post(api, "exec_shell_command", {"command": "echo \"$SSH_CONNECTION\"; pwd"},
                     cwd).json()["plain_text_response"]
        assert "127.0.0.1" in shell and str(remote) in shell  # through sshd, in the cwd
        found = post(api, "file_glob_search", {"path": ".", "include": "*.log"}, cwd).json()
        assert [e["path"] for e in found["entries"]] == ["sub/a.log"]
        slow = post(api, "exec_shell_command", {"command": "sleep 30", "timeout": 1}, cwd)
        assert "[exit code: 124]" in slow.json()["plain_text_response"]
        untrusted = post(api, "exec_shell_command", {"command": "touch pwned"},
                         {**cwd, "x-tool-runtime": "ssh:llamaq-ssh-untrusted"})
        assert "Host key verification failed" in untrusted.text, untrusted.text
        assert not (remote / "pwned").exists()
    finally:
        fleet.stop()
