"""One request cannot fill Redis (issue 43, item 9): a job's event log is capped in bytes
(keys.EVENT_LOG_MAX_BYTES: the oldest events are trimmed past it), so `n_probs` 100 (an event
of ~7 KB: 100 candidates with their `bytes`) over a long generation with `n` 4 leaves at most
4 x the cap in Redis; without the cap it was 4 x 7 KB x the tokens. Real Redis (INFO memory and
MEMORY USAGE of the logs), real api pod and worker on the tiny GGUF."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
import redis

from scheduler.contract import keys, limits
from tests.processes import Fleet

pytestmark = pytest.mark.process
N_PREDICT = 1500
N = 4


def used_memory(client: redis.Redis) -> int:
    return int(cast(dict[str, Any], client.info("memory"))["used_memory"])


def test_n_probs_100_times_n_4_leaves_redis_under_the_cap(tiny_fleet: Fleet,
                                                          redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    before = used_memory(client)
    answer = httpx.post(f"{tiny_fleet.api_urls[0]}/completion", timeout=600, json={
        "prompt": "Once upon a time", "n_predict": N_PREDICT, "ignore_eos": True,
        "n_probs": 100, "n": N, "stream": True, "temperature": 1.0})
    assert answer.status_code == 200, answer.text[:300]
    after = used_memory(client)
    logs = [k for k in client.scan_iter(match=f"{keys.PREFIX}:job:*:log", count=1000)]
    sizes = {k: int(cast(int | None, client.memory_usage(k, samples=0)) or 0) for k in logs}
    ours = sorted(sizes.values())[-N:]
    print(f"used_memory grew {(after - before) / 1e6:.1f} MB; the {N} largest logs "
          f"{[round(s / 1e6, 2) for s in ours]} MB")
    bound = N * keys.EVENT_LOG_MAX_BYTES * 1.25 + (4 << 20)
    assert all(s <= keys.EVENT_LOG_MAX_BYTES * 1.25 for s in ours), ours
    assert after - before < bound, f"Redis grew {(after - before) / 1e6:.1f} MB"


def test_choices_of_a_long_prompt_past_the_request_budget_are_413(tiny_fleet: Fleet) -> None:
    """Each of `n_cmpl` jobs carries the prompt: 4 choices of a 9 MiB prompt are 36 MiB of
    jobs on Redis, past limits.MAX_REQUEST_JOB_BYTES (32 MiB): a 413 before any job exists."""
    api = tiny_fleet.api_urls[0]
    prompt = "a " * (9 << 19)
    refused = httpx.post(f"{api}/completion", timeout=120,
                         json={"prompt": prompt, "n_predict": 1, "n_cmpl": 4})
    assert refused.status_code == 413, refused.text[:300]
    error = refused.json()["error"]
    assert error["code"] == 413 and error["type"] == "invalid_request_error"
    assert str(limits.MAX_REQUEST_JOB_BYTES) in error["message"]
