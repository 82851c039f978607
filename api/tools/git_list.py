"""`git ls-files` for file_glob_search and grep_search (llama-server's gitignore-aware
listing) run so that a repository cannot make git run anything.

A caller with `write_file` can plant a repository (`x/.git/HEAD`, `x/.git/config`, ...) and
its config is read by every git command run in it: `core.fsmonitor = "any command"` is run by
`git ls-files` (git 2.39 runs it even with no index). So git runs with the settings that run
commands overridden on its command line (which wins over every config file), no system or
global config, none of the pod's `GIT_*` environment, no pager, no prompt, no lazy fetch of a
partial clone and no protocol at all. The repository's own config is still read for what
listing needs (its excludes, `core.ignoreCase`, ...). Ours (docs/tools.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping

LS_FILES = ("ls-files", "--cached", "--others", "--exclude-standard")

SAFE_CONFIG = (
    "core.fsmonitor=false",  # the hole: a command run on every index refresh
    "core.hooksPath=/dev/null",  # no hooks (ls-files runs none today; a later git might)
    "core.pager=cat",
    "core.sshCommand=false",
    "core.askPass=",
    "credential.helper=",
    "protocol.allow=never",  # a partial clone's lazy fetch would reach a remote
    "core.untrackedCache=false",  # nothing written into a planted index
)

SAFE_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_NO_LAZY_FETCH": "1",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
}


def git_argv(*args: str) -> list[str]:
    """`git` with the safe settings first, then `args`."""
    argv = ["git", "--no-pager"]
    for setting in SAFE_CONFIG:
        argv += ["-c", setting]
    return [*argv, *args]


def git_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment `base` (the pod's by default) less every `GIT_*` variable (`GIT_DIR`,
    `GIT_CONFIG_PARAMETERS`, ...), plus the safe ones."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("GIT_")}
    return {**env, **SAFE_ENV}
