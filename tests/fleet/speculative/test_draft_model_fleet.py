"""A draft model through a real fleet (Redis, an api pod, a worker started with --spec-type
draft-simple -md): what llama-server answers for it on the wire (timings.draft_n and
draft_n_accepted, `speculative` of /slots, `speculative.types`, the llamacpp:spec_decode_*
counters), the draft model in the registry (/fleet, ours), and a worker whose draft model's
vocabulary is not the target's stops before it serves, saying so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet
from tests.worker.engine.test_engine_draft_model import LLAMA_SERVER_TOKENS, PROSE


@pytest.fixture(scope="module")
def draft_fleet(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[Fleet]:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-draft")
    fleet.add_worker("-c", "4096", "-np", "2", "-t", "2", "--spec-type", "draft-simple",
                     "-md", str(gemma_path))
    url = fleet.add_api("--metrics")
    fleet.wait_healthy(url)
    yield fleet
    fleet.stop()


def test_a_drafting_worker_answers_as_llama_server(draft_fleet: Fleet, gemma_path: Path) -> None:
    url = draft_fleet.api_urls[0]
    body = {"model": "gemma-draft", "prompt": PROSE, "n_predict": 48, "temperature": 0,
            "cache_prompt": False, "return_tokens": True}
    answer = httpx.post(f"{url}/completion", json=body, timeout=120).json()
    assert answer["tokens"] == LLAMA_SERVER_TOKENS
    timings = answer["timings"]
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (35, 35)  # llama-server's
    assert answer["generation_settings"]["speculative.types"] == "none,draft-simple"
    slots = httpx.get(f"{url}/slots", params={"model": "gemma-draft"}, timeout=30).json()
    assert all(slot["speculative"] is True for slot in slots)
    fleet = httpx.get(f"{url}/fleet", timeout=30).json()
    assert [w["draft_model"] for w in fleet["workers"]] == [str(gemma_path)]

    def value(name: str) -> float:
        lines = httpx.get(f"{url}/metrics", timeout=30).text.splitlines()
        return float(next(x for x in lines if x.startswith(f"llamacpp:{name} ")).split()[1])

    deadline = time.monotonic() + 15  # the worker's counters come with its next report
    while value("spec_decode_num_draft_tokens_total") < 35 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert value("spec_decode_num_draft_tokens_total") >= 35
    assert value("spec_decode_num_accepted_tokens_total") >= 35
    assert value("spec_decode_num_drafts_total") >= 12


def test_a_streamed_answer_is_the_plain_one(draft_fleet: Fleet) -> None:
    """Raw SSE: every accepted token is its own event, the text the non-streamed text."""
    url = draft_fleet.api_urls[0]
    body = {"model": "gemma-draft", "prompt": PROSE, "n_predict": 24, "temperature": 0,
            "cache_prompt": False, "stream": True}
    pieces: list[str] = []
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if not event.get("stop"):
                    pieces.append(event["content"])
    plain = httpx.post(f"{url}/completion", json={**body, "stream": False}, timeout=120).json()
    assert "".join(pieces) == plain["content"] and len(pieces) == 24


@pytest.mark.process
def test_a_draft_model_of_another_vocabulary_stops_the_worker(
        redis_url: str, workdir: Path, gemma_path: Path, tiny_model_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-bad-draft")
    worker = fleet.add_worker("-c", "2048", "-np", "1", "--spec-type", "draft-simple",
                              "-md", str(tiny_model_path))
    try:
        worker.wait(timeout=120)
    finally:
        fleet.stop()
    assert worker.returncode != 0
    log = " ".join((fleet.logs / "worker-0.log").read_text().split())
    assert "the target and draft vocabs are not compatible" in log, log[-2000:]
