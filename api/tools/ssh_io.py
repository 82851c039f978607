"""Tools on a remote POSIX host over ssh (`--tools-runtime ssh:TARGET`, llama-server's
`tools_io_ssh`): every operation is a command through `ssh`, as ContainerIO's go through
`<engine> exec`, the command one shell-quoted word the remote shell parses back. This is
remoting, not isolation: the tools can do what the target account can. Nobody can answer a
prompt here, so ssh runs with key-based authentication only and a host key the operator trusted
beforehand (BatchMode, StrictHostKeyChecking=yes); the target is ssh's own (`user@host`, or a
`Host` of the ssh config, which may give a port, a key and a known_hosts file)."""

from __future__ import annotations

import shlex

from api.tools.container_io import ContainerIO

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
               "-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes")


class SshIO(ContainerIO):
    def __init__(self, target: str, cwd: str = "", config: str | None = None) -> None:
        """`config`: an ssh config file (--tools-ssh-config, ours: ssh reads ~/.ssh/config
        from the account's passwd entry, not from $HOME), else ssh's own."""
        super().__init__("ssh", target, cwd)
        self.target = target
        self.config = config

    def argv(self, inner: list[str], needs_stdin: bool = False) -> list[str]:
        return ["ssh", *(["-F", self.config] if self.config else []), *SSH_OPTIONS,
                *([] if needs_stdin else ["-n"]), self.target, shlex.join(inner)]
