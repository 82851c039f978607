"""git for the file tools' listing (issue 43 item 1): what could run a command is switched
off on git's command line, and none of the pod's own GIT_* variables reaches it (the planted
repository itself: tests/fleet/tools/test_tools_git_safe.py)."""

from __future__ import annotations

from api.tools.git_list import SAFE_CONFIG, git_argv, git_env


def test_the_pods_git_variables_are_dropped() -> None:
    env = git_env({"PATH": "/bin", "GIT_DIR": "/elsewhere", "GIT_CONFIG_COUNT": "1",
                   "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "x"})
    assert env["PATH"] == "/bin"
    assert not {"GIT_DIR", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0"} & env.keys()
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"



def test_the_settings_come_before_the_command() -> None:
    argv = git_argv("ls-files")
    assert argv[:2] == ["git", "--no-pager"] and argv[-1] == "ls-files"
    assert "core.fsmonitor=false" in SAFE_CONFIG
    assert all(argv[argv.index(s) - 1] == "-c" for s in SAFE_CONFIG)
