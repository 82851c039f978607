"""`-to, --timeout` as llama-server's (cpp-httplib's read/write timeouts on the socket, not a
bound on the handler): a non-streamed generation that takes longer than --timeout is answered
(llama-server answers it too; Sanic's response timeout cut it with a 500 before); a request
that no worker takes within --timeout gets a clean 503 in the spec's error format. Real Redis,
a real api and worker on Gemma, real HTTP."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import make_fleet

TIMEOUT_S = 1
N_PREDICT = 300
"""Several times the timeout at Gemma 3 270M's pace (~60 tokens/s on a quiet core pair; the
test checks that it ran past 2 * TIMEOUT_S)."""


def test_a_generation_longer_than_the_timeout_is_answered(redis_url: str, workdir: Path,
                                                          gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-to")
    try:
        fleet.add_worker("-c", "2048", "-np", "1", "-t", "1")
        api = fleet.add_api("--timeout", str(TIMEOUT_S))
        fleet.wait_healthy(api, timeout=120)
        started = time.monotonic()
        answer = httpx.post(f"{api}/completion", timeout=300, json={
            "prompt": "Write a long story:", "n_predict": N_PREDICT, "ignore_eos": True})
        took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert took > 2 * TIMEOUT_S  # the test means something only if it ran past it
        assert answer.json()["tokens_predicted"] == N_PREDICT
    finally:
        fleet.stop()


def test_no_worker_within_the_timeout_is_a_clean_503(redis_url: str, workdir: Path,
                                                     gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-to-none")
    try:
        api = fleet.add_api("--cold-start-timeout", "0", "--timeout", str(TIMEOUT_S))
        for _ in range(3):  # Sanic's response timeout raced the job's: 500 or 503
            started = time.monotonic()
            answer = httpx.post(f"{api}/completion", timeout=60,
                                json={"prompt": "Hi", "n_predict": 2})
            assert TIMEOUT_S <= time.monotonic() - started < 30
            assert answer.status_code == 503, answer.text
            assert answer.json() == {"error": {
                "code": 503, "type": "unavailable_error",
                "message": f"no worker took this request within {TIMEOUT_S} s (--timeout)"}}
    finally:
        fleet.stop()
