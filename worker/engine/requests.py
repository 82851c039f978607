"""Turning a completion job into a Request a slot can run: tokens, limits, sampler chain.

Owns: the worker's defaults (EngineDefaults, from its flags) and how a job falls back on them;
the checks that need the model (prompt tokens valid and within the slot's context, id_slot);
the token biases applied (the request's or the server's, plus ignore_eos's bans of every
end-of-generation token, as llama-server's logit_bias_eog). Runs on the event loop, before the
request reaches the engine thread: a bad request fails here, without taking a slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import llama_cpp as lc
from llama_cpp.llama_grammar import json_schema_to_gbnf

from scheduler.contract.errors import ExceedContextSize, InvalidRequest
from scheduler.contract.jobs import CompletionJob, LogitBias, SamplingSettings, scales_of
from scheduler.contract.limits import DEFAULT_N_PROBS_MAX, check_completion, check_grammar
from scheduler.contract.results import Continuation
from scheduler.migration import continuation_seed
from worker.adapters.alora import ALoraRun, alora_plan
from worker.engine.framed_grammar import framed_alternatives, framed_grammar
from worker.engine.infill import infill_tokens
from worker.engine.message_spans import user_starts
from worker.engine.sampling import SamplerChain, resolve_sampling
from worker.kv.slots import SIMILARITY
from worker.kv.tier import TierPlan
from worker.runtime.media import MediaPrompt, context_exceeded
from worker.runtime.model import LoadedModel
from worker.runtime.vocab import Vocab
from worker.speculative.config import SpecConfig


@dataclass(frozen=True)
class EngineDefaults:
    """Server-wide settings a request falls back on (the worker's flags)."""

    sampling: SamplingSettings
    n_predict: int
    n_keep: int
    cache_prompt: bool
    special: bool
    model_alias: str
    worker_id: str
    grammar: str | None = None
    logit_bias: list[LogitBias] = field(default_factory=list)
    cont_batching: bool = True
    context_shift: bool = False
    cache_reuse: int = 0
    slot_similarity: float = SIMILARITY
    """-sps: how much of a slot's cache a prompt must share to take that slot (0: never by
    similarity; worker/kv/slots.py pick_slot)."""
    spm_infill: bool = False
    stop: list[str] = field(default_factory=list)
    """-r/--reverse-prompt: the stop strings of a request that gives none."""
    n_probs_max: int = DEFAULT_N_PROBS_MAX
    adapt_threads: bool = False
    """Compute with fewer threads while other processes want the cores
    (worker/runtime/compute_threads.py): on unless the OpenMP wait policy was set by hand."""
    spec: SpecConfig = field(default_factory=SpecConfig)
    """Speculative decoding (--spec-type and its flags; worker/speculative/)."""
    ctx_checkpoints: int = 32
    """-ctxcp: context checkpoints per slot (worker/kv/checkpoints.py)."""
    checkpoint_min_step: int = 8192
    """-cms: the least spacing between two checkpoints, in tokens."""
    cache_ram_mib: int = 0
    """--cache-ram: the host-memory prompt cache's size in MiB (-1: no limit, 0: none;
    worker/kv/prompt_cache.py)."""
    cache_idle_slots: bool = False
    """--cache-idle-slots: idle slots' prompts go to that cache when a task starts."""


@dataclass
class Request:
    """A validated completion, ready for a slot. Owns its sampler chain."""

    job: CompletionJob
    prompt_tokens: list[int]
    sampling: SamplingSettings
    sampler: SamplerChain
    n_predict: int
    cache_prompt: bool
    n_keep: int = 0
    cache_reuse: int = 0
    stop: list[str] = field(default_factory=list)
    n_discard: int = 0
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    """Token biases applied (the request's or the server's, then ignore_eos's bans)."""
    preserved: frozenset[int] = frozenset()
    """Special tokens written as text (the job's preserved_tokens, worker/engine/token_step.py)."""
    resumed: Continuation | None = None
    """Set on a continuation (its worker died, scheduler/migration.py): `prompt_tokens` are
    the prompt and the tokens generated so far, which the run starts with."""
    media: MediaPrompt | None = None
    """The prompt's media chunks (worker/runtime/media.py); its placeholders are in
    prompt_tokens."""
    alora: ALoraRun | None = None
    """An aLoRA request's two phases (worker/adapters/alora.py)."""
    adapter_set: tuple[float, ...] | None = None
    """The set decided at prepare when an aLoRA is loaded (None: the engine's rule when the
    slot starts, worker/adapters/adapter_sets.py)."""
    user_starts: tuple[int, ...] = ()
    """Where the prompt's user messages start (worker/engine/message_spans.py): the engine cuts and
    checkpoints the prefill there."""
    tier: TierPlan | None = None
    """The fleet-wide KV tier's part (--kv-store, worker/kv/tier.py): a stored prefix state
    to restore, a boundary whose state to take."""

    @property
    def n_prompt(self) -> int:
        """The request's own prompt tokens (a continuation's generated ones excluded)."""
        resumed = len(self.resumed.tokens) if self.resumed is not None else 0
        return len(self.prompt_tokens) - resumed


def prepare_request(job: CompletionJob, model: LoadedModel, defaults: EngineDefaults,
                    n_slots: int, resumed: Continuation | None = None,
                    media: list[bytes] | None = None) -> Request:
    """Check the limits, tokenize and validate; raises the request's error before it takes a
    slot (the api checked the limits too: this guards what reaches llama.cpp). `resumed`:
    a continuation, whose generated tokens follow the prompt, feed the penalties and replay
    through the grammar; a sampled one draws with a seed derived from the request's and the
    position (scheduler/migration.py). `media`: the bytes of the job's media, in order
    (worker/jobs/completion.py fetched them)."""
    check_completion(job, defaults.n_probs_max)
    vocab = model.vocab
    n_predict = defaults.n_predict if job.n_predict is None else job.n_predict
    media_prompt = media_prompt_of(job, model, media or [])
    if media_prompt is not None:
        tokens = media_prompt.tokens
    elif job.infill is not None:
        prompt = vocab.tokenize_prompt(job.prompt) if job.prompt else []
        tokens = infill_tokens(vocab, job.infill, prompt[1:] if prompt[:1] == [vocab.bos]
                               else prompt, model.plan.n_batch, n_predict, model.n_ctx_slot,
                               defaults.spm_infill)
    else:
        tokens = vocab.tokenize_prompt(job.prompt)
    if not tokens:
        raise InvalidRequest("The prompt is empty")
    bad = [t for t in tokens if not vocab.valid(t) and (media_prompt is None or t >= 0)]
    if bad:
        raise InvalidRequest(f"Invalid token id {bad[0]} in the prompt")
    n_ctx = model.n_ctx_slot
    generated = resumed.tokens if resumed is not None else []
    if len(tokens) + len(generated) >= n_ctx:
        if generated:
            raise ExceedContextSize(
                f"the continuation exceeds the available context size ({len(tokens)} + "
                f"{len(generated)} tokens, context {n_ctx})",
                n_prompt_tokens=len(tokens) + len(generated), n_ctx=n_ctx)
        raise context_exceeded(len(tokens), n_ctx)
    if job.id_slot >= n_slots:
        raise InvalidRequest(f"Invalid id_slot {job.id_slot}")
    starts = user_starts(tokens, job.message_delimiters, vocab)
    sampling = resolve_sampling(defaults.sampling, job.sampling, n_ctx)
    if generated:
        sampling = sampling.model_copy(
            update={"seed": continuation_seed(sampling.seed, len(generated))})
    biases = token_biases(job.logit_bias or defaults.logit_bias, vocab)
    if sampling.ignore_eos:  # llama-server's logit_bias_eog
        biases += [(t, float("-inf")) for t in vocab.eog_tokens]
    sampler = SamplerChain(sampling, lc.llama_model_get_vocab(model.model), vocab.n_tokens,
                           biases, grammar_of(job, defaults))
    sampler.accept_prompt([t for t in tokens if t >= 0] if media_prompt else tokens)
    if generated:
        sampler.replay(generated)
    cache_prompt = defaults.cache_prompt if job.cache_prompt is None else job.cache_prompt
    n_keep = defaults.n_keep if job.n_keep is None else job.n_keep
    cache_reuse = defaults.cache_reuse if job.n_cache_reuse is None else job.n_cache_reuse
    stop = [s for s in job.stop if s] or list(defaults.stop)
    if media_prompt is not None:
        cache_reuse = 0  # chunks are not shifted across media (llama-server: the same)
    adapter_set, alora = None, None
    if any(a.info.alora_invocation_tokens for a in model.adapters.adapters):
        wanted = tuple(model.adapters.scales if job.lora is None
                       else scales_of(len(model.adapters.adapters), job.lora))
        try:
            adapter_set, alora = alora_plan(model.adapters, wanted, tokens)
        except InvalidRequest:
            sampler.free()
            raise
    return Request(job, tokens + generated, sampling, sampler, n_predict, cache_prompt, n_keep,
                   cache_reuse, stop, n_discard=job.n_discard or 0, logit_bias=biases,
                   preserved=vocab.single_tokens(job.preserved_tokens), resumed=resumed,
                   media=media_prompt, alora=alora, adapter_set=adapter_set,
                   user_starts=starts)


def media_prompt_of(job: CompletionJob, model: LoadedModel,
                    media: list[bytes]) -> MediaPrompt | None:
    """The job's prompt with its media through the projector; None for a text-only job."""
    if not job.media:
        return None
    if model.projector is None:  # the api refuses it first (llama-server's words)
        raise InvalidRequest("multimodal_data needs a model with a multimodal projector")
    if job.infill is not None or not isinstance(job.prompt, str):
        raise InvalidRequest("media needs a prompt string (not tokens, not infill)")
    return model.projector.tokenize(job.prompt, job.media_marker, media, add_special=True,
                                    n_ctx=model.n_ctx_slot)  # checked before any encoding


def grammar_of(job: CompletionJob, defaults: EngineDefaults) -> str | None:
    if job.grammar:
        return job.grammar
    if job.json_schema is not None:
        frame = job.json_schema_frame or []
        try:  # the converter is pure Python: any failure is the schema's (or the frame's)
            if len(frame) > 3:  # one alternative per function, each in its own markers
                grammar = framed_alternatives(job.json_schema, *frame)
            else:
                grammar = str(json_schema_to_gbnf(job.json_schema))
                grammar = framed_grammar(grammar, *frame) if frame else grammar
        except Exception as exc:
            raise InvalidRequest(f"Failed to convert the JSON schema to a grammar: {exc}") from None
        check_grammar(grammar, "json_schema")  # what the schema turned into must fit too
        return grammar
    return defaults.grammar


def token_biases(biases: list[LogitBias], vocab: Vocab) -> list[tuple[int, float]]:
    """Token ids as given (out-of-range ids are ignored, as llama-server does); a string biases
    every token it tokenizes to; `None` bans."""
    out: list[tuple[int, float]] = []
    for bias in biases:
        value = float("-inf") if bias.bias is None else bias.bias
        if isinstance(bias.token, str):
            out.extend((t, value) for t in vocab.tokenize(bias.token, False, False))
        elif vocab.valid(bias.token):
            out.append((bias.token, value))
    return out
