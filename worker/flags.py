"""How the worker's llama-server flags reach llama.cpp, and which ones it refuses.

Flags that map onto llama_model_params / llama_context_params are passed through; flags for
features this worker does not have are refused at start (when set to anything but their
default) instead of being silently ignored."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp as lc

from scheduler.jobs import LogitBias, samplers_from_letters
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

UNSUPPORTED = {
    "override_kv": "--override-kv", "device": "-dev/--device", "rpc": "--rpc",
    "override_tensor": "-ot/--override-tensor", "cpu_moe": "-cmoe/--cpu-moe",
    "n_cpu_moe": "-ncmoe/--n-cpu-moe", "n_cpu_ffn": "-ncffn/--n-cpu-ffn",
    "lora": "--lora", "lora_scaled": "--lora-scaled", "control_vector": "--control-vector",
    "control_vector_scaled": "--control-vector-scaled", "mmproj": "-mm/--mmproj",
    "mmproj_url": "-mmu/--mmproj-url",
"sleep_idle_seconds": "--sleep-idle-seconds",
    "embedding": "--embedding", "reranking": "--rerank", "pooling": "--pooling",
    "backend_sampling": "-bs/--backend-sampling", "spec_type": "--spec-type",
    "spec_draft_model": "--spec-draft-model", "spec_draft_hf": "--spec-draft-hf",
    "adaptive_target": "--adaptive-target", "numa": "--numa",
}
"""Features not built yet: asking for them stops the worker with a clear message."""

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}
ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}


class UnsupportedFlag(SystemExit):
    pass


def check_supported(settings: WorkerSettings) -> None:
    defaults = WorkerSettings.model_fields
    refused = [flag for name, flag in UNSUPPORTED.items()
               if name in defaults and getattr(settings, name)
               != defaults[name].get_default(call_default_factory=True)]
    if refused:
        raise UnsupportedFlag("llamaq worker: not supported (yet): " + ", ".join(refused))


def tune_model(params: lc.llama_model_params, settings: WorkerSettings) -> None:
    params.split_mode = SPLIT_MODES[settings.split_mode]
    params.main_gpu = settings.main_gpu
    params.check_tensors = settings.check_tensors
    params.use_mmap = settings.load_mode in ("auto", "mmap", "mmap+mlock")
    params.use_mlock = "mlock" in settings.load_mode
    if settings.tensor_split:
        split = (ctypes.c_float * lc.LLAMA_MAX_DEVICES)(*settings.tensor_split)
        params.tensor_split = split
    if settings.n_gpu_layers not in ("auto", "all"):
        params.n_gpu_layers = int(settings.n_gpu_layers)
    elif settings.n_gpu_layers == "all":
        params.n_gpu_layers = -1


def tune_context(params: lc.llama_context_params, settings: WorkerSettings) -> None:
    s = settings
    if s.rope_scaling:
        params.rope_scaling_type = ROPE_SCALING[s.rope_scaling]
    if s.rope_freq_base:
        params.rope_freq_base = s.rope_freq_base
    if s.rope_freq_scale:
        params.rope_freq_scale = s.rope_freq_scale
    elif s.rope_scale:
        params.rope_freq_scale = 1.0 / s.rope_scale
    params.yarn_ext_factor = s.yarn_ext_factor
    params.yarn_attn_factor = s.yarn_attn_factor
    params.yarn_beta_fast = s.yarn_beta_fast
    params.yarn_beta_slow = s.yarn_beta_slow
    params.yarn_orig_ctx = s.yarn_orig_ctx
    params.offload_kqv = s.kv_offload
    params.op_offload = s.op_offload


def sampler_names(settings: WorkerSettings) -> list[str]:
    """--samplers, or --sampling-seq when that one was changed from its default."""
    default_seq = WorkerSettings.model_fields["sampling_seq"].get_default()
    if settings.sampling_seq != default_seq:
        return samplers_from_letters(settings.sampling_seq)
    return list(settings.samplers)


def default_grammar(settings: WorkerSettings) -> tuple[str | None, str | None]:
    """(GBNF, JSON schema text) from --grammar/--grammar-file/-j/-jf."""
    grammar = settings.grammar
    if settings.grammar_file:
        grammar = Path(settings.grammar_file).read_text()
    schema = settings.json_schema
    if settings.json_schema_file:
        schema = Path(settings.json_schema_file).read_text()
    return grammar, schema


def default_logit_bias(settings: WorkerSettings) -> list[LogitBias]:
    """-l TOKEN_ID(+/-)BIAS, e.g. `15043+1` or `15043-inf`."""
    biases = []
    for item in settings.logit_bias:
        for sign in ("+", "-"):
            token, found, value = item.partition(sign)
            if found and token.strip().isdigit():
                number = float(sign + value)
                biases.append(LogitBias(token=int(token), bias=None if number == float("-inf")
                                        else number))
                break
        else:
            raise UnsupportedFlag(f"llamaq worker: bad --logit-bias {item!r}")
    return biases
