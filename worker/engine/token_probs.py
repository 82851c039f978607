"""Token probabilities of a completion (n_probs): the chosen token's probability and the top
candidates, before sampling (a softmax of the raw logits) or after it (the candidates the
samplers left, with post_sampling_probs), as llama-server reports them.

Owns: a run's next token with its probabilities (the sampler chain is worker/engine/sampling.py's),
picking the top candidates and building TokenProbs, a piece's text (valid UTF-8 prefix). The
text of `token` is filled in once the token's text is final (worker/engine/token_step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import llama_cpp as lc

from scheduler.contract.results import Candidate, TokenProbs
from worker.engine.sampling import token_probabilities
from worker.engine.slot_run import SlotRun

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

Piece = Callable[[int], bytes]
"""A token's bytes as the engine writes them (with or without special tokens)."""


def sample(active: SlotRun, ctx: lc.llama_context_p, index: int, n_vocab: int,
           piece: Piece, accept: bool = True) -> tuple[int, TokenProbs | None]:
    """The run's next token, from the logits at `index` of the last decoded view (a forced
    end of a thinking block first), and its probabilities when the request asked n_probs
    (`accept` False: the sampler chain is not told of the token: the caller accepts it or
    another one)."""
    job = active.request.job
    post = job.n_probs > 0 and job.post_sampling_probs
    forced = active.reasoning.next_forced() if active.reasoning and accept else None
    if forced is not None:  # the end of a thinking block, cut short
        active.request.sampler.accept_prompt([forced])
        return forced, None
    token, candidates = active.request.sampler.sample(ctx, index, with_candidates=post,
                                                      accept=accept)
    if job.n_probs <= 0:
        return token, None
    if post:
        return token, post_sampling(candidates, token, job.n_probs, piece)
    probs = token_probabilities(ctx, index, n_vocab)
    return token, pre_sampling(probs, token, job.n_probs, piece)


def pre_sampling(probs: np.ndarray, token: int, n_probs: int,
                 piece: Piece) -> TokenProbs:
    """From the softmax of the raw logits: the `n_probs` most probable tokens."""
    import numpy as np

    if n_probs < probs.size:  # a partition, not a sort of the whole vocabulary (262k for Gemma)
        head = np.argpartition(-probs, n_probs - 1)[:n_probs]
        top_ids = head[np.argsort(-probs[head], kind="stable")]
    else:
        top_ids = np.argsort(-probs, kind="stable")
    top = [(int(t), float(probs[t])) for t in top_ids]
    return _probs(token, float(probs[token]), top, piece)


def post_sampling(candidates: list[tuple[int, float]], token: int, n_probs: int,
                  piece: Piece) -> TokenProbs:
    """From the candidates the samplers left (most probable first): the first `n_probs` of
    them with a probability above zero."""
    chosen = next((p for t, p in candidates if t == token), 0.0)
    top = [(t, p) for t, p in candidates[:n_probs] if p > 0.0]
    return _probs(token, chosen, top, piece)


def _probs(token: int, chosen: float, top: list[tuple[int, float]], piece: Piece) -> TokenProbs:
    return TokenProbs(id=token, token="", bytes=[], p=chosen,
                      top=[candidate(t, p, piece) for t, p in top])


def candidate(token: int, p: float, piece: Piece) -> Candidate:
    data = piece(token)
    return Candidate(id=token, token=valid_utf8_prefix(data), bytes=list(data), p=p)


def valid_utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 (llama-server's validate_utf8)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="ignore")
