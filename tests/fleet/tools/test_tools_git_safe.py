"""Issue 43 item 1: the file tools alone (`read_file,write_file,file_glob_search` under
`--tools-root`, no shell) cannot run a command through git. A caller plants a repository whose
config names a `core.fsmonitor` command; file_glob_search's `git ls-files` must not run it,
and the listing still works (git is still the gitignore engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.processes import Fleet


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("git-safe")


@pytest.fixture(scope="module")
def api(redis_url: str, root: Path) -> Iterator[str]:
    (root / "box").mkdir()
    fleet: Fleet = tools_fleet(redis_url, root, "git-safe")
    url = fleet.add_api("--tools", "read_file,write_file,file_glob_search",
                        "--tools-root", str(root / "box"))
    yield url
    fleet.stop()


def call(api: str, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    res = httpx.post(f"{api}/tools", json={"tool": tool, "params": params}, timeout=30)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    assert "error" not in body, body
    return body


def test_a_planted_fsmonitor_is_not_run(api: str, root: Path) -> None:
    marker = root / "box" / "PWNED"
    config = f'[core]\n\tfsmonitor = "touch {marker}; false"\n'
    for path, content in (("x/.git/HEAD", "ref: refs/heads/main\n"), ("x/.git/config", config),
                          ("x/.git/objects/a", ""), ("x/.git/refs/a", ""),
                          ("x/.gitignore", "ignored.txt\n"), ("x/kept.txt", "k"),
                          ("x/ignored.txt", "i")):
        call(api, "write_file", {"path": path, "content": content})
    listing = call(api, "file_glob_search", {"path": "x"})
    assert not marker.exists(), "file_glob_search ran the repository's core.fsmonitor"
    files = sorted(e["path"] for e in listing["entries"])
    assert files == [".gitignore", "kept.txt"], listing  # git still applied .gitignore
