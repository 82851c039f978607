"""The adaptive-p sampler (llama_sampler_init_adaptive_p, in the shipped libllama): named in
`samplers`, it ends the chain instead of dist, as llama.cpp's common sampler builds it; not
named, dist ends it (the default chain is unchanged)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as lc

from scheduler.contract.sampling import SamplingSettings
from worker.engine.sampling import SamplerChain
from worker.process.startup import load_model
from worker.runtime.settings import WorkerSettings


def chain_names(chain: SamplerChain) -> list[str]:
    handle = chain._chain
    return [lc.llama_sampler_name(lc.llama_sampler_chain_get(handle, i)).decode()
            for i in range(lc.llama_sampler_chain_n(handle))]


def test_adaptive_p_ends_the_chain_when_named(tiny_model_path: Path) -> None:
    settings = WorkerSettings.from_args(["-m", str(tiny_model_path), "-c", "256", "-np", "1",
                                         "-fit", "off", "--no-warmup"], environ={})
    model = load_model(settings, tiny_model_path)
    try:
        vocab = lc.llama_model_get_vocab(model.model)
        n_vocab = lc.llama_vocab_n_tokens(vocab)
        plain = SamplerChain(SamplingSettings(), vocab, n_vocab, [], None)
        assert chain_names(plain)[-1] == "dist" and "adaptive-p" not in chain_names(plain)
        config = SamplingSettings(samplers=["min_p", "adaptive_p"], adaptive_target=0.5,
                                  adaptive_decay=0.5, seed=7)
        adaptive = SamplerChain(config, vocab, n_vocab, [], None)
        assert chain_names(adaptive) == ["min-p", "adaptive-p"]
        tokens = [lc.llama_vocab_bos(vocab), 5, 6]
        array = (lc.llama_token * len(tokens))(*tokens)
        assert lc.llama_decode(model.ctx, lc.llama_batch_get_one(array, len(tokens))) == 0
        token, _ = adaptive.sample(model.ctx, -1, with_candidates=False)
        assert 0 <= token < n_vocab
        plain.free()
        adaptive.free()
    finally:
        model.close()
