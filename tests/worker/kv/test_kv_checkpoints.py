"""Context checkpoints on Gemma 3 270M (a sliding-window model, issue 24 part 2): the worker
keeps llama-server's small SWA cache (not the full-size one), and a prefix the window no
longer covers is restored from a checkpoint taken near the prompt's end, as llama-server
does: same greedy output, and a cache_n no lower than llama-server's on the same requests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from scheduler.contract.jobs import CompletionJob
from scheduler.contract.message_delimiters import MessageDelimiter
from tests.processes import free_port, wait_until
from tests.worker.kv_engine import (
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
from worker.runtime.model import LoadedModel

N_UBATCH = 256
"""A small ubatch keeps the SWA cache at 768 cells: 300 generated tokens push the prompt's
end out of the window."""
N_GEN = 300
GEMMA_DELIMITERS = [MessageDelimiter(role="assistant", delimiter="<start_of_turn>model"),
                    MessageDelimiter(role="user", delimiter="<start_of_turn>user")]
"""What llama-server's template analysis finds for Gemma 3's template (api/chat/delimiters.py)."""


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
        complete(engine, sink, prompt, N_GEN, n_probs=0)
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
        ours = [complete(engine, sink, p, n, n_probs=0).timings.cache_n for p, n in sequence]
    with llama_server(gemma_path) as url:
        theirs = [httpx.post(f"{url}/completion", timeout=300, json={
            "prompt": p, "n_predict": n, "temperature": 0, "ignore_eos": True,
        }).json()["timings"]["cache_n"] for p, n in sequence]
    print(f"cache_n: llamaq {ours}, llama-server {theirs}")
    assert all(o >= t for o, t in zip(ours, theirs, strict=True)), (ours, theirs)
    assert ours[1] > 0


def chat(*turns: str) -> str:
    """A Gemma 3 chat prompt: user and model turns by turns, then the model's."""
    roles = ("user", "model")
    return "".join(f"<start_of_turn>{roles[i % 2]}\n{turn}<end_of_turn>\n"
                   for i, turn in enumerate(turns)) + "<start_of_turn>model\n"


@pytest.mark.process
def test_a_chat_that_branches_at_its_last_user_message_restores_from_there(
        gemma: LoadedModel, gemma_path: Path) -> None:
    """The prefill is cut and checkpointed where user messages start (the job's message
    delimiters), so a second request that changes the last user message, past the window,
    reuses everything before it, as llama-server does; and its batches are llama-server's,
    so greedy tokens are too."""
    if not LLAMA_SERVER.exists():
        pytest.skip(f"no llama-server binary at {LLAMA_SERVER}")
    answer = "Noted. " + document(9, 40)
    first = chat(document(3, 150), answer, document(4, 150))  # 1,036 tokens
    branch = chat(document(3, 150), answer, document(5, 150))
    sequence = [(first, 32), (branch, 32)]
    with running(gemma) as (engine, sink):
        ours = [complete(engine, sink, p, n, GEMMA_DELIMITERS, n_probs=0) for p, n in sequence]
        n_first = ours[0].tokens_evaluated
        prepared = engine.prepare(_job(first))
        prepared.sampler.free()
        user_starts = prepared.user_starts
        cut = [c.n_tokens for c in engine.slots[0].checkpoints]
    with running(gemma) as (engine, sink):
        blind = [complete(engine, sink, p, n, n_probs=0).timings.cache_n
                 for p, n in sequence]
    assert len(user_starts) == 2 and user_starts[0] == 1  # after BOS
    # taken at both user messages (none yet; the last), then near the branch's end
    assert cut[:2] == list(user_starts), (cut, user_starts)
    with llama_server(gemma_path) as url:
        theirs = [httpx.post(f"{url}/completion", timeout=300, json={
            "prompt": p, "n_predict": n, "temperature": 0, "ignore_eos": True,
            "return_tokens": True,
            "message_delimiters": [d.model_dump() for d in GEMMA_DELIMITERS]}).json()
            for p, n in sequence]
    cache_n = [r.timings.cache_n for r in ours]
    print(f"cache_n: llamaq {cache_n}, without delimiters {blind}, llama-server "
          f"{[t['timings']['cache_n'] for t in theirs]}")
    assert n_first > 768  # past the SWA cache (512 + the ubatch): the window lost its start
    assert cache_n == [t["timings"]["cache_n"] for t in theirs]
    assert user_starts[1] - 1 <= cache_n[1] <= user_starts[1]
    assert blind[1] == 0  # no checkpoint at the user message: processed again
    assert [r.tokens for r in ours] == [t["tokens"] for t in theirs]


def _job(prompt: str) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=prompt, message_delimiters=GEMMA_DELIMITERS)


@contextmanager
def llama_server(gemma_path: Path) -> Iterator[str]:
    """The llama-server binary with this module's context, ubatch and threads; its URL."""
    port = free_port()
    server = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(gemma_path), "--port", str(port), "-c", "8192", "-np",
         "1", "-ub", str(N_UBATCH), "-t", "1", "--cache-ram", "0", "--no-warmup"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(url), 60, what="llama-server")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
