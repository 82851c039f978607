"""What a worker builds from its settings before it serves: the model (its context laid out by
llama-server's rules, for embeddings on an --embedding/--rerank worker; the file comes from
worker/wires/model_source.py) and the engine's defaults (the sampling flags resolved once into one
SamplingSettings).

Owns: settings → ContextPlan and the loaded model, settings → EngineDefaults, the embedding
context settings, the fleet's media marker. Plain functions of the settings:
worker/process/serve.py calls them once and builds the worker whole.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import llama_cpp as lc
from llama_cpp.llama_grammar import json_schema_to_gbnf
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.registry import FitMemory, FitReport
from worker.adapters.control_vectors import (
    ControlVectorError,
    apply_vectors,
    load_vectors,
    vector_specs,
)
from worker.embed.embedder import POOLING_TYPES
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.engine.sampling import DEFAULT_SEED, normalize_samplers
from worker.process.side_models import load_draft, load_projector, progress_callback
from worker.runtime import flags
from worker.runtime.compute_threads import wait_policy_by_hand
from worker.runtime.cpu_pools import cpu_plan
from worker.runtime.devices import DeviceError, offload_devices
from worker.runtime.fit import ALL_CONTEXT, FitRequest, FitResult, MiB, fit
from worker.runtime.lora import LoraAdapters, LoraLoadError, adapter_specs
from worker.runtime.media import ProjectorLoadError, media_marker
from worker.runtime.memory_probe import MemoryProbe, load_probe
from worker.runtime.model import (
    ContextPlan,
    LoadedModel,
    ModelLoadError,
    context_params,
    default_threads,
)
from worker.runtime.settings import WorkerSettings
from worker.runtime.tensor_overrides import Placement
from worker.speculative.draft_model import DraftLoadError
from worker.wires.publisher import EventPublisher

T = TypeVar("T")

log = logging.getLogger(__name__)


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


def pool_size(s: WorkerSettings, n_slots: int) -> int:
    """The context's size: -c, or with --kv-unified-per-slot N and no -c (nor -c 0, which
    asks for the model's whole context) `n_slots × N`, as llama-server's server.cpp sizes the
    shared KV pool."""
    per_slot = s.kv_unified_per_slot or 0
    if per_slot > 0 and s.ctx_size == 0 and "ctx_size" not in s.model_fields_set:
        return n_slots * per_slot
    return s.ctx_size


def context_plan(s: WorkerSettings, serves_decisions: bool = False) -> ContextPlan:
    """The shared context's layout from the flags (llama-server's rules); `serves_decisions`:
    decision jobs share its batches (several logits per sequence)."""
    n_slots = 4 if s.n_parallel < 0 else s.n_parallel
    threads = default_threads() if s.threads < 1 else s.threads
    embedding = embedding_mode(s)
    batch = embedding_batch(s) if embedding else s.batch_size
    # a slot's sampled token and its draft have logits (server_output_limits)
    per_seq = min(batch, 1 + (0 if embedding else flags.speculative(s).n_max()))
    return ContextPlan(
        n_ctx=pool_size(s, n_slots), n_slots=n_slots,
        kv_unified=s.kv_unified if s.kv_unified is not None else s.n_parallel < 0,
        n_batch=batch, n_ubatch=s.ubatch_size,
        n_threads=threads,
        n_threads_batch=s.threads_batch or threads,
        # Prefix reuse on sliding-window models goes through context checkpoints
        # (worker/kv/checkpoints.py); a decision's branches go back and forth over a prefix,
        # which only a full-size SWA cache allows.
        swa_full=s.swa_full or s.decisions or serves_decisions,
        flash_attn=s.flash_attn, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
        n_ctx_slot_cap=s.kv_unified_per_slot,
        n_outputs_max=0 if embedding or serves_decisions else min(batch, n_slots * per_seq),
        n_outputs_per_seq=per_seq,
    )


def load_model(s: WorkerSettings, path: Path,
               on_load_progress: Callable[[str, float], None] | None = None,
               adapter_files: Mapping[str, Path] | None = None,
               marker: str | None = None, serves_decisions: bool = False) -> LoadedModel:
    """The model file at `path` (worker/wires/model_source.py fetched it) and its one context,
    laid out for embeddings on an --embedding/--rerank worker, with its LoRA adapters and
    control vectors (`adapter_files`: their local files, worker/wires/model_source.py; none: the
    sources are paths) and its projector for -mm (`marker`: the fleet's media marker; none:
    this process's own); `serves_decisions`: decision jobs share its batches (several logits
    per sequence) (blocking: call it off the event loop). `on_load_progress` gets each
    stage's progress, 0..1, from this thread (side_models.load_stages: llama-server's)."""
    files = dict(adapter_files or {})
    try:
        placement = flags.placement(s)
        Placement(flags.draft_overrides(s))  # -otd/-cmoed/-ncmoed: checked before any load
    except DeviceError as error:
        raise ModelLoadError(str(error)) from None
    embedding = embedding_mode(s)
    plan = context_plan(s, serves_decisions)
    callbacks: list[Any] = []  # llama.cpp's progress callback, alive while the model loads

    def stage(name: str) -> Callable[[float], None] | None:
        report = on_load_progress
        return None if report is None else lambda value: report(name, value)

    def tune_context(params: Any) -> None:
        flags.tune_context(params, s)
        if embedding:
            tune_embedding_context(params, s)

    fitted = FitOutcome(plan, None, None)
    if s.fit == "on":
        fitted = fit_to_memory(s, path, plan, placement, tune_context)

    def tune_model(params: lc.llama_model_params) -> None:
        flags.tune_model(params, s)
        placement.apply(params)
        if fitted.n_gpu_layers is not None:
            params.n_gpu_layers = fitted.n_gpu_layers
        if (report := stage("text_model")) is not None:
            callbacks.append(progress_callback(report))
            params.progress_callback = callbacks[-1]

    model = LoadedModel(path, fitted.plan, tune_model, tune_context,
                        cpu_plan(s, fitted.plan.n_threads, fitted.plan.n_threads_batch))
    model.fitted = fitted.report
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
    if not embedding:
        try:
            model.draft = load_draft(s, model, stage("spec_model"))
        except (DraftLoadError, DeviceError) as error:
            model.close()
            raise ModelLoadError(str(error)) from None
    model.media_marker = marker or ""
    if s.mmproj:  # completions, and embeddings of inputs with media
        try:  # its warmup computes: on a thread of its own (see warm_up_on_own_thread)
            model.projector = on_own_thread(
                lambda: load_projector(s, model, plan.n_threads, marker, stage("mmproj_model")))
        except ProjectorLoadError as error:
            model.close()
            raise ModelLoadError(str(error)) from None
    if s.warmup:
        warm_up_on_own_thread(model)
    return model


@dataclass(frozen=True)
class FitOutcome:
    plan: ContextPlan
    n_gpu_layers: int | None
    """The layers to offload when the fit chose them."""
    report: FitReport | None


def fit_to_memory(s: WorkerSettings, path: Path, plan: ContextPlan, placement: Placement,
                  tune_context: Callable[[lc.llama_context_params], None]) -> FitOutcome:
    """--fit on (worker/runtime/fit.py), on llama.cpp's own projections
    (worker/runtime/memory_probe.py);
    nothing is measured when nothing could change (-c set, and -ngl set or no device): on a
    machine without an offload device that is known before the model is read (the probe's
    metadata load costs ~0.6 s of a worker's start, the time a migrated stream waits)."""
    layers_auto, has_devices = s.n_gpu_layers == "auto", bool(offload_devices())
    if plan.n_ctx != 0 and not (layers_auto and has_devices):
        return _nothing_to_fit(plan, "-ngl is set" if has_devices
                               else "there is no offload device")
    lib = load_probe()
    if lib is None:
        log.warning("--fit: there is no memory probe (it needs a C++ compiler once, see "
                    "docs/deployment.md): the arguments stay as given, as with -fit off")
        return FitOutcome(plan, None, None)

    def model_params() -> lc.llama_model_params:
        params = lc.llama_model_default_params()
        flags.tune_model(params, s)
        placement.apply(params)
        return params

    def context_of(n_ctx: int) -> lc.llama_context_params:
        params = context_params(replace(plan, n_ctx=n_ctx))
        tune_context(params)
        return params

    probe = MemoryProbe(lib, path, model_params, context_of)
    shape = probe.shape()
    if plan.n_ctx != 0 and not shape.n_devices:  # the devices there are, the model uses none
        return _nothing_to_fit(plan, "there is no offload device")
    n_ctx_given = "ctx_size" in s.model_fields_set
    request = FitRequest(
        n_ctx=plan.n_ctx, n_ctx_train=shape.n_ctx_train,
        n_streams=1 if plan.kv_unified else plan.n_slots,
        n_ctx_min=ALL_CONTEXT if n_ctx_given and plan.n_ctx == 0 else s.fit_ctx,
        margins=s.fit_margins(shape.n_devices), n_layer=shape.n_layer, layers_auto=layers_auto)
    result = fit(request, probe.measure)
    report = fit_report(result)
    (log.info if result.fits else log.warning)("--fit: %s (n_ctx %d%s)", result.note,
                                                result.n_ctx, "" if result.n_gpu_layers is None
                                                else f", {result.n_gpu_layers} layers offloaded")
    return FitOutcome(replace(plan, n_ctx=result.n_ctx), result.n_gpu_layers, report)


def _nothing_to_fit(plan: ContextPlan, why: str) -> FitOutcome:
    return FitOutcome(plan, None, FitReport(enabled=True, fits=True, n_ctx=plan.n_ctx,
                                            note=f"nothing to fit: -c is set, and {why}"))


def fit_report(result: FitResult) -> FitReport:
    """The fit's outcome as the registry shows it, in MiB."""
    projection = result.projection
    memory = [FitMemory(device=d.name, free_mib=d.free // MiB, total_mib=d.total // MiB,
                        model_mib=d.use.model // MiB, context_mib=d.use.context // MiB,
                        compute_mib=d.use.compute // MiB) for d in projection.devices]
    host = projection.host
    memory.append(FitMemory(device="host", free_mib=(projection.host_total - host.total) // MiB,
                            total_mib=projection.host_total // MiB, model_mib=host.model // MiB,
                            context_mib=host.context // MiB, compute_mib=host.compute // MiB))
    return FitReport(enabled=True, fits=result.fits, n_ctx=result.n_ctx,
                     n_gpu_layers=result.n_gpu_layers, note=result.note, memory=memory)


def warm_up_on_own_thread(model: LoadedModel) -> None:
    """--warmup on a thread that ends with it. libgomp gives each thread that starts a
    parallel region a team of its own, kept while that thread lives; with more team threads
    than cores it cuts every wait's spinning to ~100 rounds (GOMP_SPINCOUNT no longer
    applies). The loading thread stays in the event loop's pool, so a warmup there would leave
    a second team beside the engine's."""
    on_own_thread(model.warmup)


def on_own_thread(work: Callable[[], T]) -> T:
    """`work()` on a thread that ends with it (see warm_up_on_own_thread): its result, or
    what it raised."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # raised again on the caller's thread
            failure.append(error)

    thread = threading.Thread(target=run, name="llamaq-warmup")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


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
                          spec=flags.speculative(s),
                          adapt_threads=not wait_policy_by_hand(os.environ),
                          ctx_checkpoints=s.ctx_checkpoints,
                          checkpoint_min_step=s.checkpoint_min_step,
                          cache_ram_mib=0 if s.decisions else s.cache_ram,
                          cache_idle_slots=s.cache_idle_slots)


async def fleet_media_marker(redis: Redis, model_id: str) -> str:
    """LLAMA_MEDIA_MARKER, else the marker the model's first worker chose (random, as
    llama-server's): every worker and so every api pod of the model agree on one."""
    pinned = os.environ.get("LLAMA_MEDIA_MARKER", "")
    if pinned:
        return pinned
    key = keys.media_marker(model_id)
    await redis.set(key, media_marker({}), nx=True)
    chosen = await redis.get(key)
    return chosen.decode() if isinstance(chosen, bytes) else str(chosen)
