"""Idle sleep (--sleep-idle-seconds, issue 12) on a real worker of Gemma 3 270M: the model is
unloaded after the idle time (the worker's RSS drops by at least the model file's size), the
endpoints the spec exempts do not wake it, and the next completion does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import redis

from scheduler.contract import keys
from tests.conftest import make_fleet
from tests.metrics_text import series
from tests.processes import wait_until

IDLE_S = 2


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def is_sleeping(api: str) -> bool:
    response = httpx.get(f"{api}/props", timeout=10)
    assert response.status_code == 200, response.text
    value = response.json()["is_sleeping"]
    assert isinstance(value, bool)
    return value


def predicted(api: str) -> float:
    found = series(httpx.get(f"{api}/metrics", timeout=10).text)
    return found["llamacpp:tokens_predicted_total"][1]


def test_an_idle_worker_unloads_its_model_and_the_next_completion_wakes_it(
        redis_url: str, workdir: Path, gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-sleep")
    try:
        worker = fleet.add_worker("-c", "1024", "-np", "1", "-t", "1",
                                  "--sleep-idle-seconds", str(IDLE_S))
        api = fleet.add_api("--metrics")
        fleet.wait_healthy(api)
        events = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
        events.subscribe(keys.MODELS_CHANNEL)
        body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}
        first = httpx.post(f"{api}/completion", json=body, timeout=60)
        assert first.status_code == 200, first.text
        awake_rss = rss_bytes(worker.pid)
        wait_until(lambda: predicted(api) == 4, timeout=10, what="the first tokens counted")
        assert not is_sleeping(api)

        wait_until(lambda: is_sleeping(api), timeout=30, what="the worker asleep")
        time.sleep(0.5)  # the unload is published once done; let the allocator settle
        asleep_rss = rss_bytes(worker.pid)
        model_size = gemma_path.stat().st_size
        assert awake_rss - asleep_rss >= model_size, \
            f"RSS {awake_rss >> 20} MiB -> {asleep_rss >> 20} MiB, model {model_size >> 20} MiB"

        # The spec's exempt endpoints (and /slots) read the registry: none wakes the worker.
        deadline = time.monotonic() + IDLE_S + 1
        while time.monotonic() < deadline:
            for path in ("/health", "/props", "/models", "/v1/models", "/metrics", "/slots"):
                assert httpx.get(f"{api}{path}", timeout=10).status_code == 200, path
            time.sleep(0.2)
        assert is_sleeping(api)
        assert rss_bytes(worker.pid) < awake_rss - model_size // 2
        log = (fleet.logs / "worker-0.log").read_text(errors="replace")
        assert "loading" not in log.split("sleeping")[-1]

        again = httpx.post(f"{api}/completion", json=body, timeout=120)
        assert again.status_code == 200, again.text
        assert again.json()["content"] == first.json()["content"]  # the same model answers
        assert not is_sleeping(api)
        assert rss_bytes(worker.pid) > asleep_rss + model_size // 2
        # the woken engine counts on from where the old one stopped (/metrics, dashboards)
        wait_until(lambda: predicted(api) == 8, timeout=10, what="the woken worker's tokens")
        wait_until(lambda: is_sleeping(api), timeout=30, what="asleep again")
        # /models/sse tells of each change: sleeping, then loaded (no `info`: a wake-up), ...
        model_id = httpx.get(f"{api}/v1/models", timeout=10).json()["data"][0]["id"]
        seen = []
        quiet_until = time.monotonic() + 1
        while time.monotonic() < quiet_until:  # until a second passes without an event
            if (message := events.get_message(timeout=0.2)) is not None:
                seen.append(json.loads(message["data"]))
                quiet_until = time.monotonic() + 1
        statuses = [(event["model"], event["data"]) for event in seen
                    if event["event"] == "model_status"]
        assert statuses == [(model_id, {"status": "sleeping"}), (model_id, {"status": "loaded"}),
                            (model_id, {"status": "sleeping"})], seen
    finally:
        fleet.stop()


def test_input_token_counts_wake_a_sleeping_model(redis_url: str, workdir: Path,
                                                  gemma_path: Path) -> None:
    """As llama-server: /v1/chat/completions/input_tokens, /v1/responses/input_tokens and
    /v1/messages/count_tokens need the model (they tokenize the rendered prompt), so they wake
    it and answer."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-sleep-count")
    try:
        fleet.add_worker("-c", "512", "-np", "1", "-t", "1", "--sleep-idle-seconds", "1")
        api = fleet.add_api()
        fleet.wait_healthy(api)
        wait_until(lambda: is_sleeping(api), timeout=30, what="the worker asleep")
        chat = {"messages": [{"role": "user", "content": "How many tokens is this?"}]}
        counted = httpx.post(f"{api}/v1/chat/completions/input_tokens", json=chat, timeout=120)
        assert counted.status_code == 200, counted.text
        assert counted.json()["input_tokens"] > 5
        wait_until(lambda: is_sleeping(api), timeout=30, what="asleep again")
        answer = httpx.post(f"{api}/v1/responses/input_tokens",
                            json={"input": "How many tokens is this?"}, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"object": "response.input_tokens",
                                 "input_tokens": counted.json()["input_tokens"]}
        wait_until(lambda: is_sleeping(api), timeout=30, what="asleep a third time")
        anthropic = httpx.post(f"{api}/v1/messages/count_tokens", json=chat, timeout=120)
        assert anthropic.status_code == 200, anthropic.text
        assert anthropic.json()["input_tokens"] > 5
        assert not is_sleeping(api)  # the count woke it
    finally:
        fleet.stop()


def test_an_embedding_worker_sleeps_and_wakes(redis_url: str, workdir: Path,
                                              minilm_path: Path) -> None:
    """--sleep-idle-seconds with --embedding: the worker unloads when idle and the next
    embedding request wakes it, with the same vectors."""
    fleet = make_fleet(redis_url, workdir, minilm_path, "minilm-sleep")
    try:
        worker = fleet.add_worker("--embedding", "-c", "512", "-np", "2", "-t", "1",
                                  "--sleep-idle-seconds", "1")
        api = fleet.add_api()
        fleet.wait_healthy(api)
        body = {"input": ["a sleeping worker", "wakes up"]}
        first = httpx.post(f"{api}/v1/embeddings", json=body, timeout=60)
        assert first.status_code == 200, first.text
        awake_rss = rss_bytes(worker.pid)
        wait_until(lambda: is_sleeping(api), timeout=30, what="the embedding worker asleep")
        assert rss_bytes(worker.pid) < awake_rss
        again = httpx.post(f"{api}/v1/embeddings", json=body, timeout=120)
        assert again.status_code == 200, again.text
        assert [d["embedding"] for d in again.json()["data"]] == \
            [d["embedding"] for d in first.json()["data"]]
        assert not is_sleeping(api)
        wait_until(lambda: is_sleeping(api), timeout=30, what="asleep again")
        assert worker.poll() is None
    finally:
        fleet.stop()
