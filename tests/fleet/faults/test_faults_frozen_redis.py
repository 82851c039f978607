"""A frozen Redis (SIGSTOP: its socket stays open, nothing answers) is not a dead one: an open
stream ends with an SSE error event within 10 s, and once Redis goes on (SIGCONT) the fleet
serves again within 10 s. Real Redis (the test's own, since it is frozen), real api pod and
worker on Gemma 3 270M (slow enough that the stream is still running), raw SSE over httpx."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet, start_redis

pytestmark = pytest.mark.process


@pytest.fixture
def frozen_fleet(tmp_path: Path, gemma_path: Path) -> Iterator[tuple[Fleet, int]]:
    process, url = start_redis(tmp_path / "redis")
    fleet = make_fleet(url, tmp_path, gemma_path, "gemma-frozen")
    fleet.add_worker("-c", "2048", "-np", "2", "-t", "2")
    fleet.wait_healthy(fleet.add_api())
    try:
        yield fleet, process.pid
    finally:
        process.send_signal(signal.SIGCONT)
        fleet.stop()
        process.kill()
        process.wait()


def test_a_frozen_redis_ends_open_streams_and_service_comes_back(
        frozen_fleet: tuple[Fleet, int]) -> None:
    fleet, redis_pid = frozen_fleet
    api = fleet.api_urls[0]
    body = {"prompt": "Once upon a time", "n_predict": 900, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                break

        os.kill(redis_pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        error = None
        for line in lines:
            if line.startswith("data:") and '"error"' in line:
                error = json.loads(line.removeprefix("data:"))["error"]
                break
            assert time.monotonic() - frozen_at < 15, "no error event"
        ended_after = time.monotonic() - frozen_at
    assert error is not None and error["code"] == 503, error
    print(f"error event {ended_after:.1f} s after SIGSTOP")
    assert ended_after < 10, ended_after
    os.kill(redis_pid, signal.SIGCONT)
    thawed_at = time.monotonic()
    while True:
        try:
            answer = httpx.post(f"{api}/completion", timeout=5,
                                json={"prompt": "Hello", "n_predict": 2})
            if answer.status_code == 200:
                print(f"served {time.monotonic() - thawed_at:.1f} s after SIGCONT")
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() - thawed_at < 10, "no service 10 s after SIGCONT"
        time.sleep(0.2)
