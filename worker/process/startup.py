"""What a worker builds from its settings before it serves: the model (its context laid out by
llama-server's rules, for embeddings on an --embedding/--rerank worker; the file comes from
worker/model_source.py) and the engine's defaults (the sampling flags resolved once into one
SamplingSettings).

Owns: settings → ContextPlan and the loaded model, settings → EngineDefaults, the embedding
context settings. Plain functions of the settings: worker/process/serve.py calls them once
and builds the worker whole.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import llama_cpp as lc
from llama_cpp.llama_grammar import json_schema_to_gbnf

from worker import flags
from worker.compute_threads import wait_policy_by_hand
from worker.control_vectors import ControlVectorError, apply_vectors, load_vectors, vector_specs
from worker.embedder import POOLING_TYPES
from worker.engine import Engine
from worker.lora import LoraAdapters, LoraLoadError, adapter_specs
from worker.media import Projector, ProjectorLoadError, ProjectorOptions, media_marker
from worker.model import ContextPlan, LoadedModel, ModelLoadError, default_threads
from worker.publisher import EventPublisher
from worker.requests import EngineDefaults
from worker.sampling import DEFAULT_SEED, normalize_samplers
from worker.settings import WorkerSettings


def embedding_mode(settings: WorkerSettings) -> bool:
    return settings.embedding or settings.rerank


def pooling_name(settings: WorkerSettings) -> str | None:
    """--rerank means rank pooling; else --pooling; None: the model's own."""
    if settings.rerank:
        return "rank"
    return settings.pooling


def tune_embedding_context(params: lc.llama_context_params, settings: WorkerSettings) -> None:
    """Embeddings on, the pooling asked for (else the model's)."""
    params.embeddings = True
    pooling = pooling_name(settings)
    params.pooling_type = POOLING_TYPES[pooling] if pooling else lc.LLAMA_POOLING_TYPE_UNSPECIFIED


def embedding_batch(settings: WorkerSettings) -> int:
    """llama-server's rule: with embeddings the logical batch is at most the physical one
    (a sequence is decoded whole in one ubatch)."""
    return min(settings.batch_size, settings.ubatch_size)


def context_plan(s: WorkerSettings) -> ContextPlan:
    """The shared context's layout from the flags (llama-server's rules)."""
    n_slots = 4 if s.n_parallel < 0 else s.n_parallel
    threads = default_threads() if s.threads < 1 else s.threads
    embedding = embedding_mode(s)
    return ContextPlan(
        n_ctx=s.ctx_size, n_slots=n_slots,
        kv_unified=s.kv_unified if s.kv_unified is not None else s.n_parallel < 0,
        n_batch=embedding_batch(s) if embedding else s.batch_size, n_ubatch=s.ubatch_size,
        n_threads=threads,
        n_threads_batch=s.threads_batch or threads,
        # Prefix reuse on sliding-window models goes through context checkpoints
        # (worker/checkpoints.py); a decision's branches go back and forth over a prefix,
        # which only a full-size SWA cache allows.
        swa_full=s.swa_full or s.decisions,
        flash_attn=s.flash_attn, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
        n_ctx_slot_cap=s.kv_unified_per_slot,
    )


def load_model(s: WorkerSettings, path: Path,
               on_load_progress: Callable[[float], None] | None = None,
               adapter_files: Mapping[str, Path] | None = None,
               marker: str | None = None) -> LoadedModel:
    """The model file at `path` (worker/model_source.py fetched it) and its one context,
    laid out for embeddings on an --embedding/--rerank worker, with its LoRA adapters and
    control vectors (`adapter_files`: their local files, worker/model_source.py; none: the
    sources are paths) and its projector for -mm (`marker`: the fleet's media marker; none:
    this process's own) (blocking: call it off the event loop). `on_load_progress` gets the
    load's progress, 0..1, from this thread."""
    files = dict(adapter_files or {})
    embedding = embedding_mode(s)
    plan = context_plan(s)
    callbacks: list[Any] = []  # llama.cpp's progress callback, alive while the model loads

    def tune_model(params: lc.llama_model_params) -> None:
        flags.tune_model(params, s)
        if on_load_progress is not None:
            report = on_load_progress

            def progress(value: float, _: object) -> bool:
                report(value)
                return True  # go on loading

            callbacks.append(lc.llama_progress_callback(progress))
            params.progress_callback = callbacks[-1]

    def tune_context(params: Any) -> None:
        flags.tune_context(params, s)
        if embedding:
            tune_embedding_context(params, s)

    model = LoadedModel(path, plan, tune_model, tune_context)
    try:
        specs = adapter_specs(s.lora, s.lora_scaled, s.lora_init_without_apply)
        model.adapters = LoraAdapters.load(model.model, model.vocab, specs, files)
        model.adapter_files = files
        vectors = load_vectors(vector_specs(s.control_vector, s.control_vector_scaled), files)
        if vectors is not None:
            apply_vectors(model.ctx, lc.llama_model_n_layer(model.model), vectors,
                          s.control_vector_layer_range)
    except (ValueError, LoraLoadError, ControlVectorError) as error:
        model.close()
        raise ModelLoadError(str(error)) from None
    if s.mmproj and not embedding:  # an embedding worker with -mm does not start (serve.py)
        try:
            model.projector = load_projector(s, model, plan.n_threads, marker)
        except ProjectorLoadError as error:
            model.close()
            raise ModelLoadError(str(error)) from None
    if s.warmup:
        warm_up_on_own_thread(model)
    return model


def load_projector(s: WorkerSettings, model: LoadedModel, threads: int,
                   marker: str | None = None) -> Projector:
    """-mm/--mmproj on the loaded model (worker/media.py)."""
    assert s.mmproj is not None
    options = ProjectorOptions(offload=s.mmproj_offload, n_threads=threads,
                               image_min_tokens=s.image_min_tokens,
                               image_max_tokens=s.image_max_tokens,
                               batch_max_tokens=s.mtmd_batch_max_tokens)
    assert model.model is not None
    return Projector(s.mmproj, model.model, options, marker or media_marker(os.environ))


def warm_up_on_own_thread(model: LoadedModel) -> None:
    """--warmup on a thread that ends with it. libgomp gives each thread that starts a
    parallel region a team of its own, kept while that thread lives; with more team threads
    than cores it cuts every wait's spinning to ~100 rounds (GOMP_SPINCOUNT no longer
    applies). The loading thread stays in the event loop's pool, so a warmup there would leave
    a second team beside the engine's."""
    thread = threading.Thread(target=model.warmup, name="llamaq-warmup")
    thread.start()
    thread.join()


def new_engine(s: WorkerSettings, model: LoadedModel, model_id: str, worker_id: str,
               publisher: EventPublisher) -> Engine:
    """The engine on `model`, with the server-wide defaults, publishing through `publisher`."""
    return Engine(model, engine_defaults(s, model_id, worker_id), publisher.from_thread)


def engine_defaults(s: WorkerSettings, model_id: str, worker_id: str) -> EngineDefaults:
    """The server-wide settings a request falls back on."""
    given = s.sampling  # the flags, declared by SamplingSettings itself
    breakers: list[str] = []
    for breaker in given.dry_sequence_breakers:  # "none" clears those before it (llama.cpp)
        if breaker == "none":
            breakers.clear()
        else:
            breakers.append(flags.process_escapes(breaker) if s.escape else breaker)
    sampling = given.model_copy(update={
        "dry_sequence_breakers": breakers,
        "seed": DEFAULT_SEED if given.seed < 0 else given.seed,
        "samplers": normalize_samplers(flags.sampler_names(s)),
    })
    grammar, schema = flags.default_grammar(s)
    if schema and not grammar:
        grammar = str(json_schema_to_gbnf(schema))
    return EngineDefaults(sampling=sampling, n_predict=s.n_predict, n_keep=s.keep,
                          cache_prompt=s.cache_prompt, special=s.special,
                          model_alias=model_id, worker_id=worker_id,
                          grammar=grammar, logit_bias=flags.default_logit_bias(s),
                          cont_batching=s.cont_batching, spm_infill=s.spm_infill,
                          context_shift=s.context_shift, cache_reuse=s.cache_reuse,
                          slot_similarity=s.slot_prompt_similarity,
                          stop=[flags.process_escapes(r) if s.escape else r
                                for r in s.reverse_prompt],
                          n_probs_max=s.n_probs_max,
                          adapt_threads=not wait_policy_by_hand(os.environ),
                          ctx_checkpoints=s.ctx_checkpoints,
                          checkpoint_min_step=s.checkpoint_min_step,
                          cache_ram_mib=0 if s.decisions else s.cache_ram,
                          cache_idle_slots=s.cache_idle_slots)
