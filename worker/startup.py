"""What a worker builds from its settings before it serves: the model (its context laid out by
llama-server's rules; the file comes from worker/model_source.py) and the engine's defaults
(the sampling flags resolved once into one SamplingSettings).

Owns: settings → ContextPlan and the loaded model, settings → EngineDefaults. Plain
functions of the settings: worker/runtime.py calls them once and builds the runtime whole.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp as lc
from llama_cpp.llama_grammar import json_schema_to_gbnf

from scheduler.jobs import SamplingSettings
from worker import flags
from worker.compute_threads import wait_policy_by_hand
from worker.embed_jobs import embedding_batch, embedding_mode, tune_embedding_context
from worker.model import ContextPlan, LoadedModel, default_threads
from worker.requests import EngineDefaults
from worker.sampling import DEFAULT_SEED, normalize_samplers
from worker.settings import WorkerSettings


def load_model(s: WorkerSettings, path: Path,
               on_load_progress: Callable[[float], None] | None = None) -> LoadedModel:
    """The model file at `path` (worker/model_source.py fetched it) and its one context,
    laid out for embeddings on an --embedding/--rerank worker (blocking: call it off the
    event loop). `on_load_progress` gets the load's progress, 0..1, from this thread."""
    n_slots = 4 if s.n_parallel < 0 else s.n_parallel
    threads = default_threads() if s.threads < 1 else s.threads
    embedding = embedding_mode(s)
    plan = ContextPlan(
        n_ctx=s.ctx_size, n_slots=n_slots,
        kv_unified=s.kv_unified if s.kv_unified is not None else s.n_parallel < 0,
        n_batch=embedding_batch(s) if embedding else s.batch_size, n_ubatch=s.ubatch_size,
        n_threads=threads,
        n_threads_batch=s.threads_batch or threads,
        # Prefix reuse on sliding-window models (Gemma 3) needs the full-size SWA cache.
        swa_full=s.swa_full or s.cache_prompt,
        flash_attn=s.flash_attn, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
        n_ctx_slot_cap=s.kv_unified_per_slot,
    )
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
    if s.warmup:
        warm_up_on_own_thread(model)
    return model


def warm_up_on_own_thread(model: LoadedModel) -> None:
    """--warmup on a thread that ends with it. libgomp gives each thread that starts a
    parallel region a team of its own, kept while that thread lives; with more team threads
    than cores it cuts every wait's spinning to ~100 rounds (GOMP_SPINCOUNT no longer
    applies). The loading thread stays in the event loop's pool, so a warmup there would leave
    a second team beside the engine's."""
    thread = threading.Thread(target=model.warmup, name="llamaq-warmup")
    thread.start()
    thread.join()


def engine_defaults(s: WorkerSettings, model_id: str, worker_id: str) -> EngineDefaults:
    """The server-wide settings a request falls back on."""
    sampling = SamplingSettings(
        temperature=s.temp, dynatemp_range=s.dynatemp_range, dynatemp_exponent=s.dynatemp_exp,
        top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, typical_p=s.typical_p,
        top_n_sigma=s.top_n_sigma, xtc_probability=s.xtc_probability,
        xtc_threshold=s.xtc_threshold, repeat_last_n=s.repeat_last_n,
        repeat_penalty=s.repeat_penalty, presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty, dry_multiplier=s.dry_multiplier,
        dry_base=s.dry_base, dry_allowed_length=s.dry_allowed_length,
        dry_penalty_last_n=s.dry_penalty_last_n,
        dry_sequence_breakers=[flags.process_escapes(b) if s.escape else b
                               for b in s.dry_sequence_breaker] or ["\n", ":", '"', "*"],
        mirostat=s.mirostat, mirostat_tau=s.mirostat_ent, mirostat_eta=s.mirostat_lr,
        seed=DEFAULT_SEED if s.seed < 0 else s.seed, ignore_eos=s.ignore_eos,
        samplers=normalize_samplers(flags.sampler_names(s)),
    )
    grammar, schema = flags.default_grammar(s)
    if schema and not grammar:
        grammar = str(json_schema_to_gbnf(schema))
    return EngineDefaults(sampling=sampling, n_predict=s.n_predict, n_keep=s.keep,
                          cache_prompt=s.cache_prompt, special=s.special,
                          model_alias=model_id, worker_id=worker_id,
                          grammar=grammar, logit_bias=flags.default_logit_bias(s),
                          cont_batching=s.cont_batching, spm_infill=s.spm_infill,
                          context_shift=s.context_shift, cache_reuse=s.cache_reuse,
                          stop=[flags.process_escapes(r) if s.escape else r
                                for r in s.reverse_prompt],
                          n_probs_max=s.n_probs_max,
                          adapt_threads=not wait_policy_by_hand(os.environ))
