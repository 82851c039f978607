"""The n-gram modes propose llama.cpp's drafts: the same greedy request, on a fresh engine, drafts
and has accepted exactly what the vendored llama-server reported for it (its `timings.draft_n`
and `draft_n_accepted`, recorded from ~/.cache/llamaq-bench/bin/llama-server with the same
--spec-type and flags, -c 2048 -np 2, `cache_prompt: false`), with the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams
from tests.integration.test_engine_speculative import CODE, _engine, _result, _run
from worker.speculative.config import NgramMapParams, NgramModParams, resolve

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
    engine, events, model = _engine(gemma_path, resolve([types], False, mod, NgramMapParams()))
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
    engine, events, model = _engine(gemma_path, config)
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
    engine, events, model = _engine(gemma_path, config)
    try:
        job = CompletionJob(model="gemma", prompt=CODE, n_predict=80, return_tokens=True,
                            sampling=SamplingParams(temperature=0.0, seed=7))
        result = _result(_run(engine, events, job)[0])
    finally:
        engine.stop()
        model.close()
    assert (result.timings.draft_n, result.timings.draft_n_accepted) == (214, 41)
