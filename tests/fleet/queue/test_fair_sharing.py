"""Fair sharing on a real fleet (issue 47): Redis, an api pod with --tenants, one worker on
Gemma 3 270M with one slot (`-np 1`), so every other job waits in the queue.

- priority: a priority 0 request queued after priority 10 requests runs first;
- fairness: a tenant's jobs queued behind another's backlog run before it;
- preemption: a priority 0 request preempts a priority 10 generation, which ends as it would
  have undisturbed;
- a tenant that asks a priority below its cap gets a 400 naming it;
- waits and preemptions are counted per tenant and priority (/metrics, /fleet).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from scheduler.contract import keys
from tests.conftest import make_fleet
from tests.metrics_text import series
from tests.processes import Fleet, wait_until

pytestmark = pytest.mark.process

ALIAS = "gemma-fair"
TENANTS: list[dict[str, Any]] = [
    {"name": "alice", "keys": ["k-alice"]},
    {"name": "bob", "keys": ["k-bob"]},
    {"name": "capped", "keys": ["k-capped"], "default_priority": 5, "min_priority": 3},
    {"name": "ops", "keys": ["k-ops"], "admin": True},
]
HOG = {"prompt": "Tell me a long story", "n_predict": 2000, "ignore_eos": True,
       "stream": True}


@pytest.fixture(scope="module")
def fair(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[tuple[str, Fleet]]:
    path = workdir / "tenants-fair.json"
    path.write_text(json.dumps({"tenants": TENANTS}))
    fleet: Fleet = make_fleet(redis_url, workdir, gemma_path, ALIAS)
    fleet.add_worker("-c", "4096", "-np", "1", "-t", "2", "-n", "8")
    url = fleet.add_api("--tenants", str(path), "--prefix-affinity", "0", "--metrics")
    fleet.wait_healthy(url)
    warm = httpx.post(f"{url}/completion", headers=auth("k-alice"), timeout=120,
                      json={"prompt": "Once upon a time", "n_predict": 2})
    assert warm.status_code == 200, warm.text  # the worker's first decode is slow
    yield url, fleet
    fleet.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def waiting(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.zcard(keys.slot_queue(ALIAS)))  # type: ignore[arg-type]
    finally:
        client.close()


class Finishes:
    """Requests sent in threads; the order they finished in."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.order: list[str] = []
        self.answers: dict[str, httpx.Response] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, name: str, key: str, **body: Any) -> None:
        def run() -> None:
            answer = httpx.post(f"{self.url}/completion", headers=auth(key), timeout=180,
                                json={"prompt": f"Say {name}", "n_predict": 3, **body})
            with self._lock:
                self.order.append(name)
                self.answers[name] = answer

        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(200)


def test_a_priority_0_job_queued_after_priority_10_jobs_runs_first(
        fair: tuple[str, Fleet], redis_url: str) -> None:
    url, _ = fair
    before = waiting(redis_url)
    with httpx.stream("POST", f"{url}/completion", headers=auth("k-alice"), json=HOG,
                      timeout=120) as hog:
        lines = hog.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # it holds the one slot
        finishes = Finishes(url)
        for i in range(3):
            finishes.send(f"late{i}", "k-alice", priority=10)
            wait_until(lambda i=i: waiting(redis_url) >= before + 2 + i, 30, "queued")
        finishes.send("urgent", "k-alice", priority=0)  # one tenant: priority alone
        wait_until(lambda: waiting(redis_url) >= before + 5, 30, "queued")
    finishes.join()  # the hog's stream closed: it is cancelled, the slot frees
    assert all(a.status_code == 200 for a in finishes.answers.values()), finishes.answers
    assert finishes.order[0] == "urgent", finishes.order


def test_a_tenant_behind_anothers_backlog_goes_first(
        fair: tuple[str, Fleet], redis_url: str) -> None:
    """alice holds the slot and queues three more jobs; bob's, queued after them, runs
    before alice's (weighted fair queueing: bob's start tag is the model's virtual time,
    alice's are past her long generation). Four jobs wait at most (the queue's bound: 4 per
    slot)."""
    url, _ = fair
    before = waiting(redis_url)
    with httpx.stream("POST", f"{url}/completion", headers=auth("k-alice"), json=HOG,
                      timeout=120) as hog:
        lines = hog.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        finishes = Finishes(url)
        for i in range(3):
            finishes.send(f"alice{i}", "k-alice")
            wait_until(lambda i=i: waiting(redis_url) >= before + 2 + i, 30, "queued")
        finishes.send("bob", "k-bob")
        wait_until(lambda: waiting(redis_url) >= before + 5, 30, "queued")
    finishes.join()
    assert all(a.status_code == 200 for a in finishes.answers.values()), finishes.answers
    assert finishes.order[0] == "bob", finishes.order


GREEDY = {"prompt": "Write a story about a lighthouse keeper.", "n_predict": 160,
          "ignore_eos": True, "temperature": 0, "priority": 10}


def preemptions(client: redis.Redis) -> int:
    return int(client.hget(keys.model_counters(ALIAS), "preempted") or 0)  # type: ignore[arg-type]


def stream_content(response: httpx.Response, on_token: Any = None
                   ) -> tuple[str, dict[str, Any]]:
    """The text of a /completion stream and its last event; `on_token(text so far)` after
    each event."""
    content = ""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line.removeprefix("data:"))
        assert "error" not in event, event
        content += event.get("content", "")
        if on_token is not None:
            on_token(content)
    return content, event


def test_a_preempted_stream_finishes_as_an_undisturbed_greedy_run(
        fair: tuple[str, Fleet], redis_url: str) -> None:
    """A priority 0 request that comes while a priority 10 generation holds the one slot runs
    at once (--preempt priority, the default); the preempted stream pauses, never errs, and
    ends with the text of the same request undisturbed: equal, or (a prefill of prompt +
    generated tokens may round differently from step-by-step decoding, docs/faults.md) first
    different after the point where it was preempted; never a token lost or repeated."""
    url, _ = fair
    alone = httpx.post(f"{url}/completion", headers=auth("k-alice"), timeout=180,
                       json={**GREEDY, "stream": False})
    assert alone.status_code == 200, alone.text
    undisturbed = alone.json()["content"]
    client = redis.Redis.from_url(redis_url)
    preempted_before = preemptions(client)
    finishes = Finishes(url)
    seen_at_urgent: list[int] = []

    def on_token(content: str) -> None:
        if not seen_at_urgent and len(content) >= 40:
            seen_at_urgent.append(len(content))
            finishes.send("urgent", "k-bob", priority=0, n_predict=4)

    with httpx.stream("POST", f"{url}/completion", headers=auth("k-alice"), timeout=180,
                      json={**GREEDY, "stream": True}) as hog:
        assert hog.status_code == 200
        content, last = stream_content(hog, on_token)
        hog_done = list(finishes.order)
    finishes.join()
    assert finishes.answers["urgent"].status_code == 200, finishes.answers["urgent"].text
    assert hog_done == ["urgent"], "the urgent request waited for the whole generation"
    assert preemptions(client) > preempted_before
    client.close()
    if content != undisturbed:
        first = next(i for i, (a, b) in enumerate(zip(content, undisturbed, strict=False))
                     if a != b)
        assert first > seen_at_urgent[0], (first, content, undisturbed)
    assert last["stop"] and last["tokens_predicted"] == GREEDY["n_predict"], last


def test_a_priority_below_the_tenants_cap_is_a_400(fair: tuple[str, Fleet]) -> None:
    url, _ = fair
    refused = httpx.post(f"{url}/v1/chat/completions", headers=auth("k-capped"), timeout=60,
                         json={"messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 2, "priority": 1})
    assert refused.status_code == 400, refused.text
    assert "may ask priority 3 or higher" in refused.json()["error"]["message"]
    bad = httpx.post(f"{url}/completion", headers=auth("k-alice"), timeout=60,
                     json={"prompt": "hi", "n_predict": 2, "priority": "high"})
    assert bad.status_code == 400 and "priority" in bad.text, bad.text
    ok = httpx.post(f"{url}/completion", headers=auth("k-capped"), timeout=60,
                    json={"prompt": "hi", "n_predict": 2, "priority": 3})
    assert ok.status_code == 200, ok.text


def test_waits_and_preemptions_are_counted_per_tenant_and_priority(
        fair: tuple[str, Fleet]) -> None:
    """After the tests above: /metrics (the admin's view) and /fleet count each tenant's
    waits and preemptions per priority."""
    url, _ = fair
    metrics = httpx.get(f"{url}/metrics", headers=auth("k-ops"), timeout=30).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
              if line.startswith("llamaq:tenant_")}
    assert values['llamaq:tenant_preemptions_total{tenant="alice",priority="10"}'] >= 1
    assert values['llamaq:tenant_started_total{tenant="bob",priority="0"}'] >= 2
    assert values['llamaq:tenant_wait_seconds_total{tenant="alice",priority="10"}'] > 0
    fleet = httpx.get(f"{url}/fleet", headers=auth("k-ops"), timeout=30).json()
    alice = next(t for t in fleet["tenants"] if t["name"] == "alice")
    assert alice["preempted@10"] >= 1 and alice["limits"]["weight"] == 1
    # by priority, for the fleet page: started, total and mean wait, preemptions
    by_priority = {p["priority"]: p for p in alice["priorities"]}
    assert by_priority[10]["preempted"] == alice["preempted@10"]
    assert by_priority[10]["started"] == alice["started@10"] >= 1
    assert by_priority[10]["waited_s"] == alice["waited_ms@10"] / 1000 > 0
    assert by_priority[10]["mean_wait_s"] == by_priority[10]["waited_s"] / alice["started@10"]
    assert [p["priority"] for p in alice["priorities"]] == sorted(by_priority)
    # the model's preemptions, whoever's jobs they were: /fleet, /metrics, /fleet/metrics
    assert fleet["preempted"] >= alice["preempted@10"]
    found = series(metrics)
    assert found["llamaq:jobs_preempted_total"][1] == fleet["preempted"]
    per_model = series(httpx.get(f"{url}/fleet/metrics", headers=auth("k-ops"), timeout=30).text)
    assert per_model[f'llamaq:jobs_preempted_total{{model="{ALIAS}"}}'][1] == fleet["preempted"]
