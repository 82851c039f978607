"""Issue 43 item 4: a tool call cannot block its api pod. grep_search's regex runs off the
event loop under a time budget (`(a+)+$` against lines of 30 a's and a `!`, hours for Python's
`re` on the loop, leaves a concurrent stream's inter-event gap under 100 ms); a read is bounded
by the bytes it reads and refuses devices and FIFOs (`/dev/zero` says size 0 and never ends;
a FIFO's open waits for a writer). A real api pod with tools on the tiny model's fleet, the
stream measured from a process of its own."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.batches.test_upload_off_loop import gaps_of, streaming
from tests.processes import Fleet

pytestmark = [pytest.mark.process, pytest.mark.serial]  # stream gaps: alone (tests/lanes.py)


@pytest.fixture(scope="module")
def tools_api(tiny_fleet: Fleet) -> Iterator[str]:
    """A second api pod of the tiny fleet, with the file tools (no --tools-root)."""
    pod = Fleet(tiny_fleet.redis_url, tiny_fleet.workdir, tiny_fleet.common,
                logs=tiny_fleet.workdir / "logs-tiny-tools")
    url = pod.add_api("--tools", "read_file,write_file,grep_search,file_glob_search")
    pod.wait_healthy(url)
    yield url
    pod.stop()


def warm(api: str, tmp_path: Path) -> None:
    """Streams for a while first: a fresh fleet's first streams are slower."""
    streams = streaming(api, tmp_path / "warm-stop")
    time.sleep(1.5)
    (tmp_path / "warm-stop").touch()
    gaps_of(streams)


def post(api: str, tool: str, params: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{api}/tools", json={"tool": tool, "params": params}, headers=headers,
                      timeout=30)


def test_a_catastrophic_regex_leaves_streams_flowing(tools_api: str, tmp_path: Path) -> None:
    folder = tmp_path / "haystack"
    folder.mkdir()
    (folder / "a.txt").write_text(("a" * 30 + "!\n") * 200)
    warm(tools_api, tmp_path)
    streams = streaming(tools_api, tmp_path / "stop")
    try:
        time.sleep(1.0)
        started = time.monotonic()
        answer = post(tools_api, "grep_search", {"path": str(folder), "pattern": "(a+)+$"})
        took = time.monotonic() - started
        time.sleep(0.3)
    finally:
        (tmp_path / "stop").touch()
        gaps = gaps_of(streams)
    assert answer.status_code == 200, answer.text
    assert "Total matches: 0" in answer.json()["plain_text_response"]
    assert gaps, "no stream events during the search"
    print(f"grep {took:.2f} s; longest gap {max(gaps) * 1000:.0f} ms")
    assert max(gaps) < 0.1, f"a stream stalled {max(gaps) * 1000:.0f} ms during the grep"


@pytest.mark.parametrize("resp_type", ["", "base64"])
def test_a_device_is_refused_quickly(tools_api: str, resp_type: str) -> None:
    started = time.monotonic()
    res = post(tools_api, "read_file", {"path": "/dev/zero"}, **{"x-resp-type": resp_type})
    assert res.status_code == 200, res.text
    assert res.json() == {"error": "not a regular file: /dev/zero"}
    assert time.monotonic() - started < 5


def test_a_fifo_is_refused_without_waiting_for_a_writer(tools_api: str, tmp_path: Path
                                                        ) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = post(tools_api, "read_file", {"path": str(fifo)})
    assert res.json() == {"error": f"not a regular file: {fifo}"}
    grep = post(tools_api, "grep_search", {"path": str(fifo), "pattern": "x"})
    assert grep.json() == {"error": f"path does not exist: {fifo}"}  # not a file, not a folder


def test_a_long_glob_is_matched_not_a_500(tools_api: str, tmp_path: Path) -> None:
    """The backtracking glob recursed once per `*`: 5,000 of them were a RecursionError, a
    500."""
    (tmp_path / "f.txt").write_text("x")
    res = post(tools_api, "file_glob_search", {"path": str(tmp_path), "include": "*" * 5000})
    assert res.status_code == 200, res.text
    assert res.json()["entries"] == [{"path": "f.txt", "type": "file"}]


def test_a_long_line_range_read_leaves_streams_flowing(tools_api: str, tmp_path: Path) -> None:
    """read_file's line range over 4 MiB of two-byte lines (2 million of them) is decoded
    and cut in a thread, in pieces: it held the loop seconds."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"a\n" * (2 << 20) + b"last\n")
    warm(tools_api, tmp_path)
    streams = streaming(tools_api, tmp_path / "stop")
    try:
        time.sleep(1.0)
        started = time.monotonic()
        answer = post(tools_api, "read_file", {"path": str(big), "start_line": (2 << 20) + 1,
                                               "end_line": (2 << 20) + 1})
        took = time.monotonic() - started
        time.sleep(0.3)
    finally:
        (tmp_path / "stop").touch()
        gaps = gaps_of(streams)
    assert answer.json() == {"plain_text_response": "last\n"}, answer.text[:300]
    print(f"read {took:.2f} s; longest gap {max(gaps) * 1000:.0f} ms")
    assert max(gaps) < 0.1, f"a stream stalled {max(gaps) * 1000:.0f} ms during the read"


def test_slow_tool_calls_leave_the_pods_threads_free(tools_api: str, tmp_path: Path) -> None:
    """Tools run in threads of their own: 8 greps that each run their whole time budget
    (`(a|aa)+$` against 5,000 a's and a `!`) filled asyncio's default threads (6 on two
    cores), and a big JSON body (parsed in those threads) waited for them."""
    (tmp_path / "line.txt").write_text("a" * 5000 + "!\n")
    params = {"path": str(tmp_path / "line.txt"), "pattern": "(a|aa)+$"}
    with ThreadPoolExecutor(8) as pool:
        greps = [pool.submit(post, tools_api, "grep_search", params) for _ in range(8)]
        time.sleep(2.0)
        started = time.monotonic()
        body = json.dumps({"prompt": "Hi", "n_predict": 1, "pad": "x" * (2 << 20)})
        answer = httpx.post(f"{tools_api}/completion", content=body, timeout=60,
                            headers={"Content-Type": "application/json"})
        took = time.monotonic() - started
        answers = [g.result() for g in greps]
    assert answer.status_code in (200, 400), answer.text[:300]
    print(f"a 2 MiB body answered in {took:.2f} s beside 8 slow greps")
    assert took < 3, f"a big body waited {took:.1f} s for the tools' threads"
    for res in answers:
        assert "time budget" in res.json()["plain_text_response"], res.text[:300]


def test_a_write_to_a_fifo_is_refused_without_waiting_for_a_reader(tools_api: str,
                                                                    tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = post(tools_api, "write_file", {"path": str(fifo), "content": "x"})
    assert res.json() == {"error": f"failed to write file: {fifo}"}  # no reader: ENXIO
    with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb"):  # a reader: still refused
        res = post(tools_api, "write_file", {"path": str(fifo), "content": "x"})
    assert res.json() == {"error": f"not a regular file: {fifo}"}
