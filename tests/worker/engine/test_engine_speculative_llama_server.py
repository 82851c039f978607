"""The n-gram modes propose llama.cpp's drafts: the same greedy request, on a fresh engine, drafts
and has accepted exactly what the vendored llama-server reported for it (its `timings.draft_n`
and `draft_n_accepted`, recorded from ~/.cache/llamaq-bench/bin/llama-server with the same
--spec-type and flags, -c 2048 -np 2, `cache_prompt: false`), with the same tokens. The KV
layout moves the counts on both servers alike (Gemma 3's sliding-window layers: a near-tie at
token 65 of the code-edit request rounds otherwise in a draft's verify over the SWA ring): the
engine of test_engine_speculative keeps --swa-full, and its figures are llama-server's with
--swa-full (checked again for ngram-mod,ngram-simple: 493/125; 422/159 without it); the last
test runs the worker's default layout too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams
from tests.worker.engine.test_engine_speculative import CODE, _engine, _result, _run
from tests.worker.engine.test_engine_speculative import PLAN as ONE_THREAD
from worker.runtime.model import ContextPlan
from worker.speculative.config import NgramMapParams, NgramModParams, resolve

PLAN = replace(ONE_THREAD, n_threads=2, n_threads_batch=2)
"""test_engine_speculative's plan with the two threads the figures were recorded with: one
thread moves a greedy near-tie here (ggml splits some reductions between threads), and with it
the drafts' counts."""

SOURCE = "".join(f"def handler_{i}(request):\n    value = request.get('key_{i}', {i})\n"
                 f"    if value > {i * 3}:\n        return value - {i}\n    return value * 2\n\n"
                 for i in range(12))
PROMPT = ("Here is a Python file:\n\n" + SOURCE
          + "\nRepeat the file exactly, but rename handler_5 to process_5:\n\n")
"""A code-edit request: 580 prompt tokens with Gemma 3's tokenizer."""


@pytest.mark.parametrize(("types", "mod", "draft_n", "accepted"), [
    # llama-server --spec-type ngram-mod,ngram-simple (the modes' defaults)
    ("ngram-mod,ngram-simple", NgramModParams(), 493, 125),
    # llama-server --spec-type ngram-mod --spec-ngram-mod-n-match 12 --spec-ngram-mod-n-min 4
    #   --spec-ngram-mod-n-max 16
    ("ngram-mod", NgramModParams(n_match=12, n_min=4, n_max=16), 256, 120),
    # llama-server --spec-type ngram-map-k (its defaults)
    ("ngram-map-k", NgramModParams(), 395, 125),
], ids=["ngram-simple-first", "ngram-mod", "ngram-map-k"])
def test_drafts_and_acceptance_are_llama_servers(gemma_path: Path, types: str,
                                                 mod: NgramModParams, draft_n: int,
                                                 accepted: int) -> None:
    engine, events, model = _engine(gemma_path, resolve([types], False, mod, NgramMapParams()),
                                    PLAN)
    try:
        job = CompletionJob(model="gemma", prompt=PROMPT, n_predict=200, return_tokens=True,
                            sampling=SamplingParams(temperature=0.0))
        result = _result(_run(engine, events, job)[0])
    finally:
        engine.stop()
        model.close()
    assert result.timings.prompt_n == 580
    assert (result.timings.draft_n, result.timings.draft_n_accepted) == (draft_n, accepted)


def test_ngram_map_k4v_drafts_and_acceptance_are_llama_servers(gemma_path: Path) -> None:
    """llama-server --spec-type ngram-map-k4v --spec-ngram-map-k4v-size-n 4 --size-m 16
    --min-hits 2, the engine test's code prompt three times, 100 tokens: 14 drafted, 14
    accepted."""
    params = NgramMapParams(size_n=4, size_m=16, min_hits=2)
    config = resolve(["ngram-map-k4v"], False, NgramModParams(), NgramMapParams(), params, params)
    engine, events, model = _engine(gemma_path, config, PLAN)
    try:
        job = CompletionJob(model="gemma", prompt=CODE * 3, n_predict=100, return_tokens=True,
                            sampling=SamplingParams(temperature=0.0))
        result = _result(_run(engine, events, job)[0])
    finally:
        engine.stop()
        model.close()
    assert (result.timings.draft_n, result.timings.draft_n_accepted) == (14, 14)


def test_synthetic_acceptance_is_llama_servers(gemma_path: Path) -> None:
    """llama-server --spec-type ngram-simple --spec-ngram-simple-size-n 4 --size-m 16
    --spec-synth-len 3, the engine test's code prompt, 80 greedy tokens at seed 7: 214 drafted,
    41 accepted at random (the same random numbers: std::mt19937 and
    uniform_real_distribution), and the same (invalid by design) tokens."""
    config = resolve(["ngram-simple"], False, NgramModParams(),
                     NgramMapParams(size_n=4, size_m=16))
    config.synth_len = 3.0
    engine, events, model = _engine(gemma_path, config, PLAN)
    try:
        job = CompletionJob(model="gemma", prompt=CODE, n_predict=80, return_tokens=True,
                            sampling=SamplingParams(temperature=0.0, seed=7))
        result = _result(_run(engine, events, job)[0])
    finally:
        engine.stop()
        model.close()
    assert (result.timings.draft_n, result.timings.draft_n_accepted) == (214, 41)


# The worker's KV layout at llama-server's `-c 2048 -np 2`: 1,024 tokens a slot, Gemma 3's
# sliding-window layers in llama-server's ring (`n_swa + n_ubatch` cells, no --swa-full).
SWA_RING = ContextPlan(n_ctx=2048, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                       n_threads=2, n_threads_batch=2, swa_full=False, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")


@pytest.mark.parametrize(("types", "swa_full", "draft_n", "accepted", "token_65"), [
    # llama-server --spec-type ngram-cache -c 2048 -np 2: at token 65 its greedy text parts from
    # its own text without speculation (236825, "6": a near-tie rounded otherwise in the
    # 9-token verify over the SWA ring); the drafts follow the text
    ("ngram-cache", False, 181, 163, 236770),
    # the same with --swa-full: the text without speculation, every draft accepted
    ("ngram-cache", True, 166, 166, 236825),
    # llama-server --spec-type ngram-mod,ngram-simple -c 2048 -np 2 (493/125 above: --swa-full)
    ("ngram-mod,ngram-simple", False, 422, 159, 236825),
], ids=["ngram-cache-swa-ring", "ngram-cache-swa-full", "ngram-simple-first-swa-ring"])
def test_drafts_and_acceptance_are_llama_servers_in_either_kv_layout(
        gemma_path: Path, types: str, swa_full: bool, draft_n: int, accepted: int,
        token_65: int) -> None:
    """The code-edit request, 200 greedy tokens, the modes' defaults (ngram-cache: no
    -lcs/-lcd): llama-server's draft_n/draft_n_accepted and its token at 65, in the worker's
    default KV layout (the SWA ring) and with --swa-full."""
    config = resolve([types], False, NgramModParams(), NgramMapParams())
    engine, events, model = _engine(gemma_path, config, PLAN if swa_full else SWA_RING)
    try:
        job = CompletionJob(model="gemma", prompt=PROMPT, n_predict=200, return_tokens=True,
                            sampling=SamplingParams(temperature=0.0))
        result = _result(_run(engine, events, job)[0])
    finally:
        engine.stop()
        model.close()
    assert result.timings.prompt_n == 580
    assert (result.timings.draft_n, result.timings.draft_n_accepted) == (draft_n, accepted)
    assert result.tokens is not None and result.tokens[65] == token_65
