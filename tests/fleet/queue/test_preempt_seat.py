"""A preemption gives the urgent job its victim's seat at once (issue 47, the priority bench's
4x alone: worker/process/preempt.py, scheduler/queue_order.py CLAIM_URGENT). The look that finds
the urgent job claims it and the worker starts it while the victim winds down; before, the look
only reserved it, and the job started at the poll that followed the victim's whole hand back
(the engine's cancel, the publisher's flush, the hand back, two counters, arq's retry): a
dozen round trips on the way to a slot, hundreds of ms on a loaded box.

Real Redis, an api pod, one simulated worker with one slot (`--preempt priority`, the
default): a priority 10 stream holds the slot; a priority 0 request preempts it. The worker's
log says the urgent job's run began before arq retried the victim (its hand back's end), the
urgent request got its answer, and the victim's stream ended with every token of its text."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.queue.completion_stream import read_completion
from tests.processes import Fleet, wait_until
from worker.simulate.vocab import SimVocab

pytestmark = pytest.mark.process

HOG_TOKENS, ITL_MS = 100, 50  # the priority 10 stream takes 5 s undisturbed


def expected_text(prompt: str, n_predict: int) -> str:
    vocab = SimVocab()
    tokens = vocab.tokenize_prompt(prompt)
    return vocab.detokenize([vocab.generated(tokens, i, 10**6, True) for i in range(n_predict)])


def test_the_urgent_job_runs_before_its_victims_hand_back_ends(
        redis_url: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    fleet = Fleet(redis_url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")], logs=logs)
    try:
        fleet.add_worker("--simulate", "-np", "1", "--sim-itl-ms", str(ITL_MS),
                         "--sim-itl-jitter", "0", "--preempt", "priority")
        url = fleet.add_api()
        wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots") == 1, 60,
                   what="the worker")
        hog = "a priority 10 story"
        ended: dict[str, Any] = {}
        started = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", f"{url}/completion", timeout=120, json={
                    "prompt": hog, "n_predict": HOG_TOKENS, "ignore_eos": True,
                    "stream": True, "priority": 10}) as response:
                ended["hog"] = read_completion(response, started)

        thread = threading.Thread(target=stream)
        thread.start()
        assert started.wait(60), "the priority 10 stream did not start"
        urgent = httpx.post(f"{url}/completion", timeout=60,
                            json={"prompt": "urgent", "n_predict": 2, "priority": 0})
        assert urgent.status_code == 200, urgent.text
        assert "hog" not in ended, "the urgent request waited for the whole generation"
        thread.join(120)
        text, last = ended["hog"]
        assert text == expected_text(hog, HOG_TOKENS)
        assert last["stop"] and last["tokens_predicted"] == HOG_TOKENS, last
    finally:
        fleet.stop()
    worker_log = (logs / "worker-0.log").read_text(errors="replace")
    found = re.search(r"job (\w+) \(priority 10\) preempted for job (\w+) \(priority 0\)",
                      worker_log)
    assert found, worker_log[-3000:]
    victim, waiting = found.groups()
    lines = worker_log.splitlines()
    urgent_run = next(i for i, line in enumerate(lines) if f"→ {waiting}:" in line)
    victim_retry = next(i for i, line in enumerate(lines) if f"↻ {victim}:" in line)
    assert urgent_run < victim_retry, \
        "the urgent job waited for its victim's hand back:\n" + "\n".join(
            lines[min(urgent_run, victim_retry) - 2:max(urgent_run, victim_retry) + 1])
