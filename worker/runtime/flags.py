"""How the worker's llama-server flags reach llama.cpp.

Flags that map onto llama_model_params / llama_context_params are passed through. Flags for
features the worker does not have are refused before anything loads
(scheduler/config/spec_flags.py)."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp as lc

from scheduler.contract.jobs import LogitBias, samplers_from_letters
from worker.runtime.devices import parse_devices
from worker.runtime.kv_overrides import apply_kv_overrides, parse_kv_overrides
from worker.runtime.settings import WorkerSettings
from worker.runtime.tensor_overrides import (
    CPU_BUFFER,
    FFN_DENSE,
    FFN_EXPERTS,
    Override,
    Placement,
    cpu_ffn_overrides,
    parse_overrides,
)
from worker.speculative import config as spec
from worker.speculative import synthetic

log = logging.getLogger(__name__)

SPLIT_MODES = {"none": lc.LLAMA_SPLIT_MODE_NONE, "layer": lc.LLAMA_SPLIT_MODE_LAYER,
               "row": lc.LLAMA_SPLIT_MODE_ROW, "tensor": lc.LLAMA_SPLIT_MODE_TENSOR}
LOAD_MODES = {"auto": -1, "none": 0, "mmap": 1, "mlock": 2, "mmap+mlock": 3, "dio": 4}
"""llama.h's enum llama_load_mode."""
LAZY_MODES = {"off": 0, "auto": 1, "on": 2}
"""llama.h's enum llama_lazy_mode."""
ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2, "longrope": 3}


class UnsupportedFlag(SystemExit):
    pass


def tune_model(params: lc.llama_model_params, settings: WorkerSettings) -> None:
    params.split_mode = SPLIT_MODES[settings.split_mode]
    params.main_gpu = settings.main_gpu
    params.check_tensors = settings.check_tensors
    params.load_mode = LOAD_MODES[settings.load_mode]
    params.lazy_mode = LAZY_MODES[settings.lazy_mode]
    params.use_extra_bufts = settings.repack
    params.no_host = settings.no_host
    apply_kv_overrides(params, parse_kv_overrides(settings.override_kv))
    if settings.tensor_split:
        split = (ctypes.c_float * lc.LLAMA_MAX_DEVICES)(*settings.tensor_split)
        params.tensor_split = split
    if settings.n_gpu_layers not in ("auto", "all"):
        params.n_gpu_layers = int(settings.n_gpu_layers)
    elif settings.n_gpu_layers == "all":
        params.n_gpu_layers = -1


def placement(settings: WorkerSettings) -> Placement:
    """-ot, -cmoe, -ncmoe, -ncffn and -dev (worker/runtime/tensor_overrides.py): where tensors
    go."""
    overrides = parse_overrides(settings.override_tensor)
    if settings.cpu_moe:
        overrides.append(Override(FFN_EXPERTS, CPU_BUFFER))
    overrides += cpu_ffn_overrides(settings.n_cpu_moe, FFN_EXPERTS)
    overrides += cpu_ffn_overrides(settings.n_cpu_ffn, FFN_DENSE)
    devices = None if settings.devices is None else parse_devices(settings.devices)
    return Placement(overrides, devices)


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
    params.no_perf = not s.perf


def sampler_names(settings: WorkerSettings) -> list[str]:
    """--samplers, or --sampling-seq when that one was changed from its default."""
    default_seq = WorkerSettings.model_fields["sampling_seq"].get_default()
    if settings.sampling_seq != default_seq:
        return samplers_from_letters(settings.sampling_seq)
    return list(settings.sampling.samplers)


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


def speculative(settings: WorkerSettings) -> spec.SpecConfig:
    """--spec-type and its flags, checked as llama.cpp's arguments check them (its messages),
    and the types llamaq cannot draft with refused by name."""
    s = settings
    checks = (
        (0 <= s.spec_ngram_mod_n_min <= 1024, "ngram n-min must be between 0 and 1024 inclusive"),
        (0 <= s.spec_ngram_mod_n_max <= 1024, "ngram n-max must be between 0 and 1024 inclusive"),
        (1 <= s.spec_ngram_mod_n_match <= 1024,
         "ngram size N must be between 1 and 1024 inclusive"),
        (1 <= s.spec_ngram_simple_size_n <= 1024,
         "ngram size N must be between 1 and 1024 inclusive"),
        (1 <= s.spec_ngram_simple_size_m <= 1024,
         "ngram size M must be between 1 and 1024 inclusive"),
        (s.spec_ngram_simple_min_hits >= 1, "ngram min hits must be at least 1"),
        *((1 <= size_n <= 1024, "ngram size N must be between 1 and 1024 inclusive")
          for size_n in (s.spec_ngram_map_k_size_n, s.spec_ngram_map_k4v_size_n)),
        *((1 <= size_m <= 1024, "ngram size M must be between 1 and 1024 inclusive")
          for size_m in (s.spec_ngram_map_k_size_m, s.spec_ngram_map_k4v_size_m)),
        *((hits >= 1, "ngram min hits must be at least 1")
          for hits in (s.spec_ngram_map_k_min_hits, s.spec_ngram_map_k4v_min_hits)),
    )
    for ok, message in checks:
        if not ok:
            raise UnsupportedFlag(f"llamaq worker: {message}")
    try:
        config = spec.resolve(
            s.spec_type, s.spec_default,
            spec.NgramModParams(n_match=s.spec_ngram_mod_n_match, n_max=s.spec_ngram_mod_n_max,
                                n_min=s.spec_ngram_mod_n_min),
            spec.NgramMapParams(size_n=s.spec_ngram_simple_size_n,
                                size_m=s.spec_ngram_simple_size_m,
                                min_hits=s.spec_ngram_simple_min_hits),
            spec.NgramMapParams(size_n=s.spec_ngram_map_k_size_n,
                                size_m=s.spec_ngram_map_k_size_m,
                                min_hits=s.spec_ngram_map_k_min_hits),
            spec.NgramMapParams(size_n=s.spec_ngram_map_k4v_size_n,
                                size_m=s.spec_ngram_map_k4v_size_m,
                                min_hits=s.spec_ngram_map_k4v_min_hits))
    except spec.UnknownSpecType as error:
        raise UnsupportedFlag(f"llamaq worker: {error}") from error
    refused = spec.refusal(config.types)
    if refused is not None:
        raise UnsupportedFlag(f"llamaq worker: {refused}")
    config.draft = draft_params(s)
    if s.lookup_cache_static and not Path(s.lookup_cache_static).is_file():
        raise UnsupportedFlag("llamaq worker: --lookup-cache-static: failed to open lookup "
                              f"cache: {s.lookup_cache_static}")
    dynamic = Path(s.lookup_cache_dynamic) if s.lookup_cache_dynamic else None
    if dynamic is not None and ((dynamic.exists() and not dynamic.is_file())
                                or not dynamic.parent.is_dir()):
        # written by llamaq (worker/speculative/lookup_share.py): none there yet is fine
        raise UnsupportedFlag("llamaq worker: --lookup-cache-dynamic: cannot write lookup "
                              f"cache: {dynamic}")
    config.lookup_cache_static = s.lookup_cache_static or None
    config.lookup_cache_dynamic = s.lookup_cache_dynamic or None
    if "draft-simple" in config.types:
        if not (s.spec_draft_model or s.spec_draft_hf):
            raise UnsupportedFlag("llamaq worker: --spec-type draft-simple needs a draft model: "
                                  "give -md/--spec-draft-model (a GGUF file) or -hfd")
        config.draft_model = s.spec_draft_model or s.spec_draft_hf  # -hfd: its path once fetched
    config.synth_len, config.synth_rates = s.spec_synth_len, list(s.spec_synth_rates)
    if config.synth_len is not None or config.synth_rates:
        if not config.enabled:
            raise UnsupportedFlag("llamaq worker: synthetic acceptance requires an initialized "
                                  "speculative decoding context")
        try:
            synthetic.resolve_rates(config.synth_len, config.synth_rates, config.n_max())
        except synthetic.SynthError as error:
            raise UnsupportedFlag(f"llamaq worker: {error}") from error
    return config


def draft_params(s: WorkerSettings) -> spec.DraftParams:
    """--spec-draft-n-max/-n-min/-p-min/-p-split, checked as llama.cpp's arguments are (and
    --spec-draft-n-ubatch, -ncmoed, -ngld)."""
    if s.spec_draft_n_max < 0:
        raise UnsupportedFlag("llamaq worker: --spec-draft-n-max: invalid value")
    if s.spec_draft_n_ubatch < 0:
        raise UnsupportedFlag("llamaq worker: --spec-draft-n-ubatch: invalid value")
    if s.spec_draft_n_cpu_moe < 0:
        raise UnsupportedFlag("llamaq worker: -ncmoed/--spec-draft-n-cpu-moe: invalid value")
    draft_gpu_layers(s)
    return spec.DraftParams(n_max=s.spec_draft_n_max, n_min=s.spec_draft_n_min,
                            p_min=s.spec_draft_p_min, p_split=s.spec_draft_p_split)


def draft_gpu_layers(s: WorkerSettings) -> int | None:
    """-ngld: a number, `all` (every layer) or `auto` (None: llama.cpp's default)."""
    value = s.spec_draft_ngl
    if value == "auto":
        return None
    if value == "all":
        return -1
    try:
        return int(value)
    except ValueError:
        raise UnsupportedFlag(f"llamaq worker: -ngld/--spec-draft-ngl: invalid value: "
                              f"{value}") from None


def draft_overrides(settings: WorkerSettings) -> list[Override]:
    """-otd, -cmoed and -ncmoed: the draft model's own tensor buffer overrides, in the order
    llama-server's arguments push them (none of the target's -ot/-cmoe/-ncmoe/-ncffn)."""
    overrides = parse_overrides(settings.spec_draft_override_tensor,
                                "--spec-draft-override-tensor")
    if settings.spec_draft_cpu_moe:
        overrides.append(Override(FFN_EXPERTS, CPU_BUFFER))
    return overrides + cpu_ffn_overrides(settings.spec_draft_n_cpu_moe, FFN_EXPERTS)


def tune_draft_model(params: lc.llama_model_params, settings: WorkerSettings) -> Placement:
    """The draft model's llama_model_params: the target's (split mode, load mode, ...), with
    -ngld's layers, -devd's devices (else -dev's) and -otd/-cmoed/-ncmoed's tensor overrides
    in place of the target's (llama.cpp's common_base_params_to_speculative). The returned
    placement holds the arrays: keep it until the model is loaded."""
    tune_model(params, settings)
    params.n_gpu_layers = lc.llama_model_default_params().n_gpu_layers
    layers = draft_gpu_layers(settings)
    if layers is not None:
        params.n_gpu_layers = layers
    chosen = settings.spec_draft_device or settings.devices
    devices = None if chosen is None else parse_devices(chosen)
    placed = Placement(draft_overrides(settings), devices)
    placed.apply(params)
    return placed


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"',
            ord("\\"): b"\\"}


def process_escapes(text: str) -> str:
    """-e/--escape (the default): \\n, \\r, \\t, \\', \\", \\\\ and \\xHH in -r and
    --dry-sequence-breaker values, as llama.cpp's string_process_escapes reads them."""
    raw, out, i = text.encode(), bytearray(), 0
    while i < len(raw):
        if raw[i] == ord("\\") and i + 1 < len(raw):
            i += 1
            code = raw[i]
            if code in _ESCAPES:
                out += _ESCAPES[code]
            elif code == ord("x") and _is_hex(raw[i + 1:i + 3]):
                out.append(int(raw[i + 1:i + 3], 16))
                i += 2
            else:
                out += b"\\" + bytes([code])
        else:
            out.append(raw[i])
        i += 1
    return out.decode("utf-8", errors="replace")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)
