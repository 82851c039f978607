"""--tools-root (ours) on a real api pod: the file tools and the x-tool-cwd header stay inside
the folder; `..`, absolute paths, `~` and symlinks out of it are refused with the tool's error
(200 `{"error": ...}`), a cwd header out of it with a 400; relative paths and commands start
there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.processes import Fleet


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("rooted")
    root, outside = base / "root", base / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "inside.txt").write_text("inside\n")
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside / "secret.txt", root / "link.txt")
    os.symlink(outside, root / "linkdir")
    return base


@pytest.fixture(scope="module")
def api(redis_url: str, tree: Path) -> Iterator[str]:
    fleet: Fleet = tools_fleet(redis_url, tree, "rooted")
    url = fleet.add_api("--tools", "all", "--tools-root", str(tree / "root"))
    yield url
    fleet.stop()


def post(api: str, tool: str, params: dict[str, Any],
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{api}/tools", json={"tool": tool, "params": params},
                      headers=headers or {}, timeout=30)


def test_inside_works_relative_to_the_root(api: str, tree: Path) -> None:
    assert post(api, "read_file", {"path": "inside.txt"}).json() == \
        {"plain_text_response": "inside\n"}
    assert post(api, "read_file", {"path": str(tree / "root" / "inside.txt")}).status_code == 200
    assert post(api, "write_file", {"path": "sub/new.txt", "content": "n"}).json()["bytes"] == 1
    assert (tree / "root" / "sub" / "new.txt").read_text() == "n"
    res = post(api, "exec_shell_command", {"command": "pwd"}).json()["plain_text_response"]
    assert res.startswith(str(tree / "root"))
    assert post(api, "get_info", {}).json()["cwd"] == str(tree / "root")
    sub = post(api, "read_file", {"path": "../inside.txt"}, {"x-tool-cwd": "sub"})
    assert sub.json() == {"plain_text_response": "inside\n"}  # `..` that stays inside


@pytest.mark.parametrize("path", ["../outside/secret.txt", "OUTSIDE_ABS", "~/.bashrc",
                                  "link.txt", "linkdir/secret.txt", "sub/../../outside/secret.txt"])
def test_escapes_are_refused(api: str, tree: Path, path: str) -> None:
    path = path.replace("OUTSIDE_ABS", str(tree / "outside" / "secret.txt"))
    res = post(api, "read_file", {"path": path})
    assert res.status_code == 200
    assert "outside the tools root" in res.json()["error"]
    assert "secret" not in res.text.replace("secret.txt", "")


def test_every_file_tool_is_confined(api: str, tree: Path) -> None:
    outside = str(tree / "outside")
    for tool, params in (("write_file", {"path": "linkdir/planted.txt", "content": "x"}),
                         ("edit_file", {"path": "link.txt", "edits": [
                             {"old_text": "secret", "new_text": "gone"}]}),
                         ("file_glob_search", {"path": outside}),
                         ("grep_search", {"path": outside, "pattern": "secret"})):
        res = post(api, tool, params)
        assert res.status_code == 200 and "outside the tools root" in res.json()["error"], tool
    assert not (tree / "outside" / "planted.txt").exists()
    assert (tree / "outside" / "secret.txt").read_text() == "secret\n"
    # a search inside the root does not follow a link out of it
    found = post(api, "grep_search", {"path": ".", "pattern": "secret"}).json()
    assert "Total matches: 0" in found["plain_text_response"]


def test_cwd_header_outside_is_refused(api: str, tree: Path) -> None:
    for cwd in (str(tree / "outside"), "../outside", "linkdir"):
        res = post(api, "exec_shell_command", {"command": "ls"}, {"x-tool-cwd": cwd})
        assert res.status_code == 400, cwd
        assert "outside the tools root" in res.json()["message"]
