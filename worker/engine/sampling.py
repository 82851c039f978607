"""Per-slot sampler chains built from llama.cpp's own samplers, in llama-server's order.

Owns: resolving a request's sampling overrides against the worker's defaults (one
`model_copy(update=…)`, after llama-server's checks and clamps of scheduler/contract/limits.py); the
llama_sampler chain of a run (biases, grammar-first rejection sampling, the samplers in order,
dist) and its candidates for post-sampling probabilities. The settings themselves are declared
once, as scheduler/contract/sampling.py SamplingSettings.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import TYPE_CHECKING

import llama_cpp as lc

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import DEFAULT_SEED, SamplingParams, SamplingSettings
from scheduler.contract.limits import SOFT_LIMITS, UINT32_MASK, check_sampling, clamp

if TYPE_CHECKING:
    import numpy as np  # imported where used: a worker serving plain sampling never loads it

__all__ = ["DEFAULT_SEED", "SamplerChain", "normalize_samplers", "resolve_sampling",
           "token_probabilities"]
CANONICAL_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                      "xtc", "temperature", "adaptive_p")
SAMPLER_NAMES = {
    **{name: name for name in CANONICAL_SAMPLERS},
    # llama.cpp's aliases of a name with '_': kebab-case and without the dashes
    **{name.replace("_", "-"): name for name in CANONICAL_SAMPLERS if "_" in name},
    **{name.replace("_", ""): name for name in CANONICAL_SAMPLERS if "_" in name},
    "typical_p": "typ_p",
    "typ": "typ_p",
    "nucleus": "top_p",
    "temp": "temperature",
}


def resolve_sampling(defaults: SamplingSettings, request: SamplingParams,
                     n_ctx: int) -> SamplingSettings:
    """The worker's defaults with the request's values, checked and clamped as llama-server
    does (scheduler/contract/limits.py), and the penalty windows clamped to the context
    (`n_ctx`)."""
    check_sampling(request)
    overrides = request.model_dump(exclude_none=True)
    if "samplers" in overrides:
        overrides["samplers"] = normalize_samplers(overrides["samplers"])
    seed = overrides.get("seed", 0)
    if seed < 0:
        overrides["seed"] = DEFAULT_SEED
    elif seed > UINT32_MASK:
        overrides["seed"] = seed & UINT32_MASK
    for name in SOFT_LIMITS:
        if name in overrides:
            overrides[name] = clamp(name, overrides[name])
    if overrides.get("dry_base", defaults.dry_base) < 1.0:
        overrides["dry_base"] = defaults.dry_base  # llama-server: < 1 takes the server's value
    config = defaults.model_copy(update=overrides)
    config.repeat_last_n = _window(config.repeat_last_n, n_ctx)
    config.dry_penalty_last_n = _window(config.dry_penalty_last_n, n_ctx)
    return config


def _window(last_n: int, n_ctx: int) -> int:
    """A penalty window: -1 (a server default) or anything larger than the context is the
    context size, which is all there is to look back on; llama.cpp allocates that much."""
    return n_ctx if last_n < 0 or last_n > n_ctx else last_n


def normalize_samplers(names: list[str]) -> list[str]:
    """Known sampler names (and aliases) in the order given; unknown names are skipped, as
    llama-server does."""
    return [SAMPLER_NAMES[n.lower()] for n in names if n.lower() in SAMPLER_NAMES]


class SamplerChain:
    """A slot's samplers for one request: the llama_sampler chain, plus an optional grammar
    applied before it (grammar-first, so every sampled token is valid)."""

    def __init__(self, config: SamplingSettings, vocab: lc.llama_vocab_p, n_vocab: int,
                 biases: list[tuple[int, float]], grammar: str | None) -> None:
        self._vocab = vocab
        self._n_vocab = n_vocab
        self._grammar = None
        if grammar:
            self._grammar = lc.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self._grammar:
                raise InvalidRequest("Failed to parse grammar")
        params = lc.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain = lc.llama_sampler_chain_init(params)
        for sampler in self._samplers(config, n_vocab, biases + self._suppressed()):
            lc.llama_sampler_chain_add(self._chain, sampler)
        self._candidates: np.ndarray | None = None

    def _samplers(self, c: SamplingSettings, n_vocab: int,
                  biases: list[tuple[int, float]]) -> list[lc.llama_sampler_p]:
        out = [_logit_bias(n_vocab, biases)] if biases else []
        if c.mirostat == 1:
            return [*out, lc.llama_sampler_init_temp(c.temperature),
                    lc.llama_sampler_init_mirostat(n_vocab, c.seed, c.mirostat_tau,
                                                   c.mirostat_eta, 100)]
        if c.mirostat == 2:
            return [*out, lc.llama_sampler_init_temp(c.temperature),
                    lc.llama_sampler_init_mirostat_v2(c.seed, c.mirostat_tau, c.mirostat_eta)]
        for name in c.samplers:
            if name != "adaptive_p":
                out.append(self._one(name, c, n_vocab))
        if "adaptive_p" in c.samplers:  # it selects the token, as dist does: last, instead
            out.append(lc.llama_sampler_init_adaptive_p(c.adaptive_target, c.adaptive_decay,
                                                        c.seed))
        else:
            out.append(lc.llama_sampler_init_dist(c.seed))
        return out

    def _one(self, name: str, c: SamplingSettings, n_vocab: int) -> lc.llama_sampler_p:
        match name:
            case "penalties":
                return lc.llama_sampler_init_penalties(
                    n_vocab, c.repeat_last_n, c.repeat_penalty, c.frequency_penalty,
                    c.presence_penalty)
            case "dry":
                breakers = [b.encode() for b in c.dry_sequence_breakers]
                arr = (ctypes.c_char_p * len(breakers))(*breakers)
                return lc.llama_sampler_init_dry(
                    self._vocab, c.dry_multiplier, c.dry_base, c.dry_allowed_length,
                    c.dry_penalty_last_n, arr, len(breakers))
            case "top_n_sigma":
                return lc.llama_sampler_init_top_n_sigma(c.top_n_sigma)
            case "top_k":
                return lc.llama_sampler_init_top_k(c.top_k)
            case "typ_p":
                return lc.llama_sampler_init_typical(c.typical_p, c.min_keep)
            case "top_p":
                return lc.llama_sampler_init_top_p(c.top_p, c.min_keep)
            case "min_p":
                return lc.llama_sampler_init_min_p(c.min_p, c.min_keep)
            case "xtc":
                return lc.llama_sampler_init_xtc(c.xtc_probability, c.xtc_threshold, c.min_keep,
                                                 c.seed)
            case _:
                return lc.llama_sampler_init_temp_ext(c.temperature, c.dynatemp_range,
                                                      c.dynatemp_exponent)

    def _suppressed(self) -> list[tuple[int, float]]:
        """The model's suppress tokens (gguf tokenizer.ggml.suppress_tokens) are banned."""
        count = ctypes.c_int32(0)
        tokens = lc.llama_vocab_get_suppress_tokens(self._vocab, ctypes.byref(count))
        return [(tokens[i], -math.inf) for i in range(count.value)]

    def accept_prompt(self, tokens: list[int]) -> None:
        """Prompt tokens feed the penalties, not the grammar (as llama-server does)."""
        for token in tokens:
            lc.llama_sampler_accept(self._chain, token)

    def replay(self, tokens: list[int]) -> None:
        """Tokens generated before (a continuation's): accepted as if sampled here, by the
        penalties and the grammar, so both are in the state they had after them."""
        for token in tokens:
            lc.llama_sampler_accept(self._chain, token)
            if self._grammar is not None:
                lc.llama_sampler_accept(self._grammar, token)

    def sample(self, ctx: lc.llama_context_p, batch_index: int,
               with_candidates: bool, accept: bool = True) -> tuple[int, list[tuple[int, float]]]:
        """Sample from the logits at `batch_index` of the last decode and accept the token
        (`accept` False: leave that to `accept_token`, as synthetic speculative acceptance
        does). With `with_candidates`, also the candidates left after the samplers, most
        probable first, as (token, probability)."""
        if self._grammar is None and not with_candidates and accept:
            return int(lc.llama_sampler_sample(self._chain, ctx, batch_index)), []
        cur = self._candidates_from(ctx, batch_index)
        lc.llama_sampler_apply(self._chain, ctypes.byref(cur))
        token = int(cur.data[cur.selected].id)
        if self._grammar is not None and not self._grammar_allows(token):
            # Rejection sampling, as llama.cpp does: the grammar pass over the whole
            # vocabulary is costly, so it only runs when the free choice is not allowed.
            cur = self._candidates_from(ctx, batch_index)
            lc.llama_sampler_apply(self._grammar, ctypes.byref(cur))
            lc.llama_sampler_apply(self._chain, ctypes.byref(cur))
            token = int(cur.data[cur.selected].id)
        if accept:
            self.accept_token(token, grammar=True)
        if not with_candidates:
            return token, []
        import numpy as np

        n = int(cur.size)
        dtype = candidate_dtype()
        view = np.ctypeslib.as_array(ctypes.cast(cur.data, ctypes.POINTER(ctypes.c_uint8)),
                                     shape=(n * dtype.itemsize,)).view(dtype)
        order = np.argsort(-view["p"], kind="stable")
        return token, [(int(view["id"][i]), float(view["p"][i])) for i in order]

    def accept_token(self, token: int, grammar: bool) -> None:
        """`token` into the chain's state (penalties, ...) and, with `grammar`, the grammar's
        (llama.cpp's common_sampler_accept(accept_grammar))."""
        lc.llama_sampler_accept(self._chain, token)
        if grammar and self._grammar is not None:
            lc.llama_sampler_accept(self._grammar, token)

    def _grammar_allows(self, token: int) -> bool:
        single = lc.llama_token_data(token, 1.0, 0.0)
        array = lc.llama_token_data_array(data=ctypes.pointer(single), size=1, selected=-1,
                                          sorted=False)
        lc.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(math.isfinite(single.logit))

    def _candidates_from(self, ctx: lc.llama_context_p,
                         batch_index: int) -> lc.llama_token_data_array:
        import numpy as np

        if self._candidates is None:
            self._candidates = np.zeros(self._n_vocab, dtype=candidate_dtype())
        candidates = self._candidates
        candidates["id"] = np.arange(self._n_vocab, dtype=np.int32)
        logits = lc.llama_get_logits_ith(ctx, batch_index)
        candidates["logit"] = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        candidates["p"] = 0.0
        return lc.llama_token_data_array(
            data=candidates.ctypes.data_as(lc.llama_token_data_p), size=self._n_vocab,
            selected=-1, sorted=False)

    def free(self) -> None:
        for sampler in (self._chain, self._grammar):
            if sampler is not None:
                lc.llama_sampler_free(sampler)
        self._chain = self._grammar = None


@functools.cache
def candidate_dtype() -> np.dtype:
    """llama_token_data as a numpy record."""
    import numpy as np

    return np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _logit_bias(n_vocab: int, biases: list[tuple[int, float]]) -> lc.llama_sampler_p:
    array = (lc.llama_logit_bias * len(biases))()
    for i, (token, bias) in enumerate(biases):
        array[i] = lc.llama_logit_bias(token, bias)
    return lc.llama_sampler_init_logit_bias(n_vocab, len(biases), array)


def token_probabilities(ctx: lc.llama_context_p, batch_index: int,
                        n_vocab: int) -> np.ndarray:
    """Softmax of the raw logits at `batch_index` (llama-server's pre-sampling probabilities)."""
    import numpy as np

    logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, batch_index),
                                   shape=(n_vocab,)).astype(np.float64)
    logits -= logits.max()
    probs = np.exp(logits)
    probs /= probs.sum()
    return probs
