"""Context checkpoints on Gemma 3 270M (a sliding-window model, issue 24 part 2): the worker
keeps llama-server's small SWA cache (not the full-size one), and a prefix the window no
longer covers is restored from a checkpoint taken near the prompt's end, as llama-server
does: same greedy output, and a cache_n no lower than llama-server's on the same requests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.kv_engine import (
    LLAMA_SERVER,
    complete,
    document,
    kv_log,
    kv_mib,
    llama_server_kv_mib,
    plan,
    running,
    same_next_token,
)
from tests.processes import free_port, wait_until
from worker.model import LoadedModel

N_UBATCH = 256
"""A small ubatch keeps the SWA cache at 768 cells: 300 generated tokens push the prompt's
end out of the window."""
N_GEN = 300


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LoadedModel]:
    model = LoadedModel(gemma_path, plan(8192, 1, N_UBATCH))
    yield model
    model.close()


@pytest.fixture(scope="module")
def prompt() -> str:
    return document(1, 250)


@pytest.fixture(scope="module")
def long_prompt() -> str:
    """About 2,000 tokens (the issue's repeated long prompt)."""
    return document(2, 820)


@pytest.mark.process
def test_kv_bytes_are_llama_servers_at_32k_and_4_slots(gemma_path: Path) -> None:
    with kv_log() as lines:
        ours = LoadedModel(gemma_path, plan(32768, 4))
    ours.close()
    with kv_log() as full_lines:
        full = LoadedModel(gemma_path, plan(32768, 4, swa_full=True))
    full.close()
    ours_mib, full_mib = kv_mib(lines), kv_mib(full_lines)
    assert ours_mib > 0
    assert full_mib > 2 * ours_mib  # --swa-full, as the worker forced it before, is far more
    if not LLAMA_SERVER.exists():
        pytest.skip(f"no llama-server binary at {LLAMA_SERVER}")
    theirs = llama_server_kv_mib(gemma_path, "-c", "32768", "-np", "4", "-ub", "512")
    assert theirs > 0
    assert abs(ours_mib - theirs) <= 0.05 * theirs, (ours_mib, theirs)


def test_a_prompt_past_the_window_comes_back_from_a_checkpoint(gemma: LoadedModel,
                                                               prompt: str) -> None:
    assert gemma.n_swa == 512
    with running(gemma) as (engine, sink):
        first = complete(engine, sink, prompt, N_GEN)
        n_prompt = first.tokens_evaluated
        assert n_prompt > 2 * N_UBATCH
        slot = engine.slots[0]
        assert [c.n_tokens for c in slot.checkpoints] == [n_prompt - 4 - N_UBATCH, n_prompt - 4]
        again = complete(engine, sink, prompt, 24)
    # the window lost the prompt's end; the checkpoint 4 tokens before it holds it, and its
    # last token is decoded again (llama-server's pos_next = max(pos_min + 1, pos_max)); a
    # cache reused as it is would say n_prompt - 1
    assert again.timings.cache_n == n_prompt - 5
    assert same_next_token(first, again)
    with running(gemma, ctx_checkpoints=0) as (engine, sink):
        complete(engine, sink, prompt, N_GEN)
        without = complete(engine, sink, prompt, 24)
    assert without.timings.cache_n == 0  # processed again: nothing holds the window
    assert same_next_token(without, again)


def test_a_short_gap_needs_no_checkpoint(gemma: LoadedModel, prompt: str) -> None:
    with running(gemma) as (engine, sink):
        first = complete(engine, sink, prompt, 4)
        again = complete(engine, sink, prompt, 4)
    assert again.timings.cache_n == first.tokens_evaluated - 1
    assert same_next_token(first, again)


@pytest.mark.process
def test_cache_n_is_at_least_llama_servers(gemma: LoadedModel, gemma_path: Path,
                                           long_prompt: str) -> None:
    if not LLAMA_SERVER.exists():
        pytest.skip(f"no llama-server binary at {LLAMA_SERVER}")
    prompt = long_prompt
    sequence = [(prompt, N_GEN), (prompt, 16), (prompt + " And more.", 16), (prompt, 16)]
    with running(gemma) as (engine, sink):
        ours = [complete(engine, sink, p, n).timings.cache_n for p, n in sequence]
    port = free_port()
    server = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(gemma_path), "--port", str(port), "-c", "8192", "-np",
         "1", "-ub", str(N_UBATCH), "-t", "2", "--cache-ram", "0", "--no-warmup"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(url), 60, what="llama-server")
        theirs = []
        for p, n in sequence:
            reply = httpx.post(f"{url}/completion", timeout=300, json={
                "prompt": p, "n_predict": n, "temperature": 0, "ignore_eos": True})
            theirs.append(reply.json()["timings"]["cache_n"])
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"cache_n: llamaq {ours}, llama-server {theirs}")
    assert all(o >= t for o, t in zip(ours, theirs, strict=True)), (ours, theirs)
    assert ours[1] > 0


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
