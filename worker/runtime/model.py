"""Loading a GGUF model and creating the one llama_context that all slots share.

Owns: the llama_model and llama_context handles and their lifetime (close), the model's
metadata as reported (`meta`), the per-slot context size. Does not own: how the context is laid
out from the flags (worker/process/startup.py), where the file comes from
(worker/wires/model_source.py)."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc

from scheduler.registry import FitReport, ModelMeta
from worker.runtime.cpu_pools import CpuPlan, ThreadPools, init_numa
from worker.runtime.llama_logs import route_llama_logs
from worker.runtime.lora import LoraAdapters
from worker.runtime.media import Projector
from worker.runtime.vocab import Vocab
from worker.speculative.draft_model import DraftModel

log = logging.getLogger(__name__)

CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
               "iq4_nl": 20, "bf16": 30}
FLASH_ATTN = {"auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class ModelLoadError(RuntimeError):
    """The model or its context could not be created (a start-up failure, not a request error)."""


@dataclass(frozen=True)
class ContextPlan:
    """How the shared context is laid out: llama-server's rules for slots and KV."""

    n_ctx: int
    n_slots: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_threads_batch: int
    swa_full: bool
    flash_attn: str
    cache_type_k: str
    cache_type_v: str
    n_ctx_slot_cap: int | None = None
    """--kv-unified-per-slot: the most context one slot may use."""
    n_outputs_max: int = 0
    """The most tokens with logits in one decode (0: n_batch). llama-server's rule
    (server_output_limits): one per slot for completions, so the compute buffer holds the
    logits of n_slots rows, not of n_batch (with Gemma's 262k vocabulary at -b 2048, 81 MiB
    instead of 514); decisions read several rows per sequence and keep n_batch."""
    n_outputs_per_seq: int = 1
    """The most tokens with logits of one sequence in a decode (with n_outputs_max > 0): 1, or
    1 + the longest draft when speculative decoding is on (llama-server's
    common_speculative_get_output_limits; n_outputs_max is then n_slots times that, at most
    n_batch)."""


class LoadedModel:
    def __init__(self, path: Path, plan: ContextPlan,
                 tune_model: Callable[[lc.llama_model_params], None] = lambda _: None,
                 tune_context: Callable[[lc.llama_context_params], None] = lambda _: None,
                 cpu: CpuPlan | None = None):
        """`tune_model` / `tune_context` set the flags that pass straight through to llama.cpp;
        `cpu`: --numa and the thread pools of the CPU placement flags."""
        route_llama_logs()
        lc.llama_backend_init()
        if cpu is not None:
            init_numa(cpu.numa)
        mparams = lc.llama_model_default_params()
        tune_model(mparams)
        self.path = path
        self.model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"failed to load model from {path}")
        self.vocab = Vocab(lc.llama_model_get_vocab(self.model))
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.model)
        cparams = context_params(plan)
        tune_context(cparams)
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise ModelLoadError(f"failed to create a context for {path} ({plan})")
        self.pools: ThreadPools | None = None
        if cpu is not None and cpu.main is not None and cpu.batch is not None:
            try:
                self.pools = ThreadPools(self.ctx, cpu.main, cpu.batch)
            except RuntimeError as error:
                lc.llama_free(self.ctx)
                lc.llama_model_free(self.model)
                raise ModelLoadError(str(error)) from None
        self.memory = lc.llama_get_memory(self.ctx)
        self.adapters = LoraAdapters.none()
        """Its LoRA adapters (worker/process/startup.py loads them)."""
        self.adapter_files: dict[str, Path] = {}
        """The local files of its adapter and control vector sources (loaded again on wake)."""
        self.plan = plan
        self.projector: Projector | None = None
        """-mm/--mmproj: the multimodal projector (worker/process/startup.py loads it)."""
        self.media_marker = ""
        """The fleet's media marker: /props reports it also for a text-only model, as
        llama-server does (a projector's marker is this one)."""
        self.fitted: FitReport | None = None
        """What --fit decided (worker/process/startup.py)."""
        self.draft: DraftModel | None = None
        """-md with --spec-type draft-simple: the draft model (worker/process/startup.py loads
        it; worker/speculative/draft_model.py)."""
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.n_swa = 0 if plan.swa_full else max(0, lc.llama_model_n_swa(self.model))
        """The sliding window the KV cache keeps (0: none, or --swa-full)."""
        self.rollback_only_full = bool(lc.llama_model_is_recurrent(self.model)
                                       or lc.llama_model_is_hybrid(self.model))
        """A recurrent or hybrid memory: a part of a sequence cannot be removed."""
        self.n_ctx_slot = min(lc.llama_n_ctx_seq(self.ctx), self.n_ctx_train,
                              plan.n_ctx_slot_cap or self.n_ctx_train)
        log.info("model %s loaded: n_ctx=%d, slots=%d, n_ctx_slot=%d, kv_unified=%s", path.name,
                 self.n_ctx, plan.n_slots, self.n_ctx_slot, plan.kv_unified)

    def warmup(self) -> None:
        """--warmup: one decode of [BOS, EOS], as llama.cpp runs at start, then an empty cache:
        the first request does not pay for the backend's first-use set-up."""
        tokens = [t for t in (self.vocab.bos, self.vocab.eos) if t >= 0] or [0]
        array = (lc.llama_token * len(tokens))(*tokens)
        lc.llama_set_warmup(self.ctx, True)
        try:
            if lc.llama_decode(self.ctx, lc.llama_batch_get_one(array, len(tokens))) != 0:
                log.warning("warmup decode failed")
            lc.llama_synchronize(self.ctx)
        finally:
            lc.llama_memory_clear(self.memory, True)
            lc.llama_set_warmup(self.ctx, False)
        log.info("model warmed up")

    def meta_value(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def meta(self) -> ModelMeta:
        template = lc.llama_model_chat_template(self.model, None)
        vocab = self.vocab
        return ModelMeta(  # the projector's modalities and marker when -mm loaded one
            vocab_type=lc.llama_vocab_type(lc.llama_model_get_vocab(self.model)),
            n_vocab=vocab.n_tokens,
            n_ctx_train=self.n_ctx_train,
            n_embd=lc.llama_model_n_embd(self.model),
            n_params=lc.llama_model_n_params(self.model),
            size=lc.llama_model_size(self.model),
            chat_template=template.decode("utf-8", errors="replace") if template else None,
            bos_token=vocab.text_of(vocab.bos) if vocab.bos >= 0 else "",
            eos_token=vocab.text_of(vocab.eos) if vocab.eos >= 0 else "",
            model_ftype=self.ftype_name(),
            media_marker=self.media_marker,
        ).model_copy(update={} if self.projector is None else {
            "modalities": self.projector.modalities(), "media_marker": self.projector.marker})

    def ftype_name(self) -> str:
        """llama.cpp's name of the weights' type, the last part of its model description
        (`gemma3 270M Q4_K - Medium`); the bindings have no call for it alone."""
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self.model, buf, len(buf))
        parts = buf.value.decode("utf-8", errors="replace").split(" ", 2)
        return parts[2] if len(parts) == 3 else ""

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
            self.draft = None
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.pools is not None:  # after the context that used them
            self.pools.free()
            self.pools = None
        if self.model:
            lc.llama_model_free(self.model)
            self.model = None


def context_params(plan: ContextPlan) -> lc.llama_context_params:
    """The llama_context_params of `plan` (the flags passed straight through come after)."""
    params = lc.llama_context_default_params()
    params.n_ctx = plan.n_ctx
    params.n_batch = plan.n_batch
    params.n_ubatch = min(plan.n_ubatch, plan.n_batch)
    params.n_seq_max = plan.n_slots
    params.n_threads = plan.n_threads
    params.n_threads_batch = plan.n_threads_batch
    params.swa_full = plan.swa_full
    params.kv_unified = plan.kv_unified
    params.flash_attn_type = FLASH_ATTN[plan.flash_attn]
    params.type_k = CACHE_TYPES[plan.cache_type_k]
    params.type_v = CACHE_TYPES[plan.cache_type_v]
    params.no_perf = True  # --perf: tune_context
    params.embeddings = False
    params.n_outputs_max = plan.n_outputs_max
    params.n_outputs_max_per_seq = 0 if plan.n_outputs_max == 0 else plan.n_outputs_per_seq
    return params


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)
