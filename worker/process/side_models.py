"""The models a worker loads beside its own (worker/process/startup.py load_model calls
them): the draft model of --spec-type draft-simple and the multimodal projector of -mm, each
reporting its load's progress as the spec's `spec_model` / `mmproj_model` stages."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp as lc

from worker.runtime import flags
from worker.runtime.devices import DeviceError, parse_devices
from worker.runtime.media import Projector, ProjectorLoadError, ProjectorOptions, media_marker
from worker.runtime.model import CACHE_TYPES, FLASH_ATTN, LoadedModel
from worker.runtime.settings import WorkerSettings
from worker.speculative.draft_model import DraftLoadError, DraftModel, DraftPlan, incompatibility

log = logging.getLogger(__name__)


def load_stages(s: WorkerSettings) -> list[str]:
    """The stages of a load, in order, as llama-server lists them in its loading events."""
    stages = ["text_model"]
    if (s.spec_draft_model or s.spec_draft_hf) and not (s.embedding or s.rerank):
        stages.append("spec_model")  # any -md: llama-server loads it even without draft-simple
    if s.mmproj:
        stages.append("mmproj_model")
    return stages


def progress_callback(report: Callable[[float], None]) -> Any:
    """llama.cpp's load progress callback calling `report(value)` (keep it alive while the
    model loads)."""
    def progress(value: float, _: object) -> bool:
        report(value)
        return True  # go on loading

    return lc.llama_progress_callback(progress)


def load_draft(s: WorkerSettings, model: LoadedModel,
               progress: Callable[[float], None] | None = None) -> DraftModel | None:
    """-md with --spec-type draft-simple: the draft model in a context laid out as the target's
    (its size, sequences, batches, threads unless -td/-tbd, physical batch unless
    --spec-draft-n-ubatch), its vocabulary checked against the
    target's (llama.cpp's common_speculative_are_compatible). -md without draft-simple loads
    nothing: llama-server loads it and lets it go again, drafting with nothing. `progress`: the
    load's, 0..1 (the spec's `spec_model` stage)."""
    config = flags.speculative(s)
    if config.draft_model is None:
        if s.spec_draft_model or s.spec_draft_hf:
            log.warning("the draft model %s is not used: --spec-type has no draft-simple",
                        s.spec_draft_model or s.spec_draft_hf)
            if progress is not None:  # its stage (load_stages) ends, as llama-server's load
                progress(1.0)
        return None
    plan = model.plan
    n_threads = s.spec_draft_threads if s.spec_draft_threads > 0 else plan.n_threads
    n_threads_batch = (s.spec_draft_threads_batch if s.spec_draft_threads_batch > 0
                       else n_threads if s.spec_draft_threads > 0 else plan.n_threads_batch)
    draft_plan = DraftPlan(n_ctx=model.n_ctx, n_seq=plan.n_slots, kv_unified=plan.kv_unified,
                           n_batch=plan.n_batch,
                           n_ubatch=s.spec_draft_n_ubatch or plan.n_ubatch, n_threads=n_threads,
                           n_threads_batch=n_threads_batch,
                           type_k=CACHE_TYPES[s.spec_draft_type_k],
                           type_v=CACHE_TYPES[s.spec_draft_type_v],
                           flash_attn_type=FLASH_ATTN[plan.flash_attn])
    path = Path(config.draft_model)
    if not path.is_file():
        raise DraftLoadError(f"failed to load draft model, '{path}': no such file")
    kept: list[object] = []  # the device array and the callback, alive while the model loads

    def tune(params: lc.llama_model_params) -> None:
        kept.append(flags.tune_draft_model(params, s))
        if progress is not None:
            callback = progress_callback(progress)
            kept.append(callback)
            params.progress_callback = callback

    draft = DraftModel(path, draft_plan, tune)
    if progress is not None:
        progress(1.0)  # as llama-server reports the stage's end
    assert model.model is not None
    reason = incompatibility(lc.llama_model_get_vocab(model.model), draft.vocab)
    if reason is not None:
        draft.close()
        raise DraftLoadError(f"the target and draft vocabs are not compatible: {reason}")
    return draft


def load_projector(s: WorkerSettings, model: LoadedModel, threads: int,
                   marker: str | None = None,
                   progress: Callable[[float], None] | None = None) -> Projector:
    """-mm/--mmproj on the loaded model (worker/runtime/media.py); `progress`: the load's, 0..1
    (the spec's `mmproj_model` stage)."""
    assert s.mmproj is not None
    offload, device = s.mmproj_offload, None
    chosen = s.mmproj_device or (s.devices if offload else None)  # it follows -dev (llama.cpp)
    if chosen is not None:  # -mmdev: none, or exactly one device (llama-server's)
        try:
            devices = parse_devices(chosen)
        except DeviceError as error:
            raise ProjectorLoadError(str(error)) from None
        if len(devices) > 1 and s.mmproj_device is not None:
            raise ProjectorLoadError("only one device may be specified for mmproj")
        offload, device = bool(devices), devices[0].handle if devices else None
    options = ProjectorOptions(offload=offload, device=device, n_threads=threads,
                               image_min_tokens=s.image_min_tokens,
                               image_max_tokens=s.image_max_tokens,
                               batch_max_tokens=s.mtmd_batch_max_tokens,
                               video_fps=s.video_fps,
                               video_timestamp_interval_ms=s.video_timestamp_interval,
                               video_ffmpeg_dir=s.video_ffmpeg_dir,
                               flash_attn_type=FLASH_ATTN[s.flash_attn], warmup=s.warmup,
                               progress=progress)
    assert model.model is not None
    return Projector(s.mmproj, model.model, options, marker or media_marker(os.environ))
