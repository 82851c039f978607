"""Turning embedding and rerank jobs into token sequences, with llama-server's checks.

Runs on the event loop's side (in a thread), before anything reaches the embedder thread: an
input that fails here never takes a place in a decode. The messages and types are
llama-server's (tools/server/server-context.cpp, server-common.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import llama_cpp as lc

from scheduler.contract.errors import ExceedContextSize, InvalidRequest, LlamaqError, ServerError
from scheduler.contract.jobs import EmbeddingJob, MediaPromptInput, PromptPiece, RerankJob
from worker.runtime.media import MediaPrompt
from worker.runtime.model import LoadedModel

NO_PROJECTOR = "Multimodal data provided, but model does not support multimodal requests."
TOKENIZE_FAILED = "Failed to tokenize prompt"


@dataclass
class Prepared:
    """One input: its tokens, or why it cannot run."""

    index: int
    tokens: list[int]
    error: LlamaqError | None = None
    media: MediaPrompt | None = None
    """An input with media: its spans (encoded) over the placeholder positions of `tokens`."""


def embedding_inputs(job: EmbeddingJob, model: LoadedModel,
                     media: Mapping[int, list[bytes] | LlamaqError] | None = None
                     ) -> list[Prepared]:
    """Each input tokenized as llama-server's tokenize_input_subprompt does (special tokens
    added to a leading string and parsed), then checked against the batch and context (media
    tokens count). `media`: the bytes of each input with media (or why they could not be
    read), by input index."""
    prepared = []
    for index, item in enumerate(job.inputs):
        media_prompt = None
        try:
            if isinstance(item, MediaPromptInput):
                media_prompt = media_input(item, (media or {}).get(index), model)
                tokens = media_prompt.tokens
            else:
                tokens = _tokenize_input(item, model)
        except LlamaqError as error:
            prepared.append(Prepared(index, [], error))
            continue
        prepared.append(Prepared(index, tokens, check_size(tokens, model), media_prompt))
    return prepared


def media_input(item: MediaPromptInput, data: list[bytes] | LlamaqError | None,
                model: LoadedModel) -> MediaPrompt:
    """An input with media through the projector (decoded and encoded here, off the embedder's
    thread). Every failure is llama-server's 500 with its words: its embedding handler lets
    what tokenizing throws reach the generic handler."""
    if model.projector is None:  # the api refuses it first
        raise ServerError(NO_PROJECTOR)
    if isinstance(data, LlamaqError):
        raise data
    if data is None or item.prompt.count(item.marker) != len(data):
        raise ServerError(TOKENIZE_FAILED)
    try:
        return model.projector.tokenize(item.prompt, item.marker, data, add_special=True)
    except InvalidRequest as error:
        raise ServerError(error.message) from None


def rerank_inputs(job: RerankJob, model: LoadedModel) -> list[Prepared]:
    """One sequence per document, as llama-server's format_prompt_rerank builds it."""
    template = lc.llama_model_chat_template(model.model, b"rerank")
    prepared = []
    for index, document in enumerate(job.documents):
        try:
            if template:
                prompt = template.decode("utf-8", errors="replace")
                prompt = prompt.replace("{query}", job.query).replace("{document}", document)
                tokens = model.vocab.tokenize(prompt, add_special=False, parse_special=True)
            else:
                tokens = _pair_tokens(job.query, document, model)
        except LlamaqError as error:
            prepared.append(Prepared(index, [], error))
            continue
        prepared.append(Prepared(index, tokens, check_size(tokens, model)))
    return prepared


def _pair_tokens(query: str, document: str, model: LoadedModel) -> list[int]:
    """[BOS] query [EOS] [SEP] document [EOS], each special token as the vocabulary asks
    (EOS falls back on SEP)."""
    vocab = lc.llama_model_get_vocab(model.model)
    eos = lc.llama_vocab_eos(vocab)
    if eos == lc.LLAMA_TOKEN_NULL:
        eos = lc.llama_vocab_sep(vocab)
    add_eos = bool(lc.llama_vocab_get_add_eos(vocab))
    tokens: list[int] = []
    if lc.llama_vocab_get_add_bos(vocab):
        tokens.append(lc.llama_vocab_bos(vocab))
    tokens += model.vocab.tokenize(query, add_special=False, parse_special=False)
    if add_eos:
        tokens.append(eos)
    if lc.llama_vocab_get_add_sep(vocab):
        tokens.append(lc.llama_vocab_sep(vocab))
    tokens += model.vocab.tokenize(document, add_special=False, parse_special=False)
    if add_eos:
        tokens.append(eos)
    return tokens


def _tokenize_input(item: str | list[PromptPiece], model: LoadedModel) -> list[int]:
    tokens = model.vocab.tokenize_prompt(item)
    if not tokens:  # a model that adds no BOS, given ""
        raise InvalidRequest("Input content cannot be empty")
    bad = [t for t in tokens if not model.vocab.valid(t)]
    if bad:
        raise InvalidRequest(f"Invalid token id {bad[0]} in the input")
    return tokens


def check_size(tokens: list[int], model: LoadedModel) -> LlamaqError | None:
    """A sequence is decoded whole in one physical batch (llama-server's rule for embeddings
    that cannot be split), and must fit a slot's context."""
    n_ubatch = lc.llama_n_ubatch(model.ctx)
    if len(tokens) > n_ubatch:
        return ServerError(f"input ({len(tokens)} tokens) is too large to process. increase "
                           f"the physical batch size (current batch size: {n_ubatch})")
    if len(tokens) > model.n_ctx_slot:
        return ExceedContextSize(
            f"input ({len(tokens)} tokens) is larger than the max context size "
            f"({model.n_ctx_slot} tokens). skipping",
            n_prompt_tokens=len(tokens), n_ctx=model.n_ctx_slot)
    return None
