"""`--preempt fair` on a real fleet of simulated workers (issue 47 item 3): Redis, an api pod
with --tenants, one simulated worker with two slots. Alice's two long streams hold both slots;
Bob's request, of the same priority, takes one of them at once (Bob holds none of his share of
one slot) instead of waiting for a stream to end; Alice's preempted stream pauses, continues
and ends with every token of its text (the simulator's text is a function of the prompt), and
the preemption is counted for her."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.queue.completion_stream import read_completion
from tests.processes import Fleet, wait_until
from worker.simulate.vocab import SimVocab

pytestmark = pytest.mark.process

TENANTS = [{"name": "alice", "keys": ["k-alice"]}, {"name": "bob", "keys": ["k-bob"]},
           {"name": "ops", "keys": ["k-ops"], "admin": True}]
HOG_TOKENS, ITL_MS = 200, 50  # each of Alice's streams takes 10 s undisturbed


def expected_text(prompt: str, n_predict: int) -> str:
    vocab = SimVocab()
    tokens = vocab.tokenize_prompt(prompt)
    return vocab.detokenize([vocab.generated(tokens, i, 10**6, True) for i in range(n_predict)])


def stream(url: str, prompt: str, into: dict[str, Any], started: threading.Event) -> None:
    with httpx.stream("POST", f"{url}/completion", headers={"Authorization": "Bearer k-alice"},
                      timeout=120, json={"prompt": prompt, "n_predict": HOG_TOKENS,
                                         "ignore_eos": True, "stream": True}) as response:
        text, last = read_completion(response, started)
    into[prompt] = (text, last, time.monotonic())


def test_a_tenant_without_a_slot_takes_one_from_the_tenant_over_its_share(
        redis_url: str, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": TENANTS}))
    fleet = Fleet(redis_url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    try:
        fleet.add_worker("--simulate", "-np", "2", "--sim-itl-ms", str(ITL_MS),
                         "--sim-itl-jitter", "0", "--preempt", "fair")
        url = fleet.add_api("--tenants", str(tenants), "--metrics")
        wait_until(lambda: httpx.get(f"{url}/props", headers={"Authorization": "Bearer k-ops"}
                                     ).json().get("total_slots") == 2, 60, what="the worker")
        ended: dict[str, Any] = {}
        hogs = [f"alice tells story {i}" for i in range(2)]
        threads = []
        for prompt in hogs:
            started = threading.Event()
            threads.append(threading.Thread(target=stream, args=(url, prompt, ended, started)))
            threads[-1].start()
            assert started.wait(60), "alice's stream did not start"
        asked = time.monotonic()
        bob = httpx.post(f"{url}/completion", headers={"Authorization": "Bearer k-bob"},
                         timeout=120, json={"prompt": "bob asks", "n_predict": 3})
        bob_done = time.monotonic()
        assert bob.status_code == 200, bob.text
        for thread in threads:
            thread.join(120)
        assert all(ended[p][2] > bob_done for p in hogs), \
            f"bob waited {bob_done - asked:.1f} s: for one of alice's streams to end"
        for prompt in hogs:
            text, last, _ = ended[prompt]
            assert text == expected_text(prompt, HOG_TOKENS), (prompt, text)
            assert last["stop"] and last["tokens_predicted"] == HOG_TOKENS, last
        metrics = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer k-ops"}).text
        assert 'llamaq:tenant_preemptions_total{tenant="alice",priority="0"} 1' in metrics
    finally:
        fleet.stop()
