"""Worker flags: refused features, what reaches llama.cpp's params, --sampling-seq, -l."""

from __future__ import annotations

import llama_cpp as lc
import pytest

from api.settings import ApiSettings
from scheduler.config.command_line import split_args
from worker.runtime.flags import (
    default_logit_bias,
    process_escapes,
    sampler_names,
    tune_context,
    tune_model,
)
from worker.runtime.settings import WorkerSettings


def settings(*argv: str) -> WorkerSettings:
    return WorkerSettings.from_args(list(argv), environ={})


def test_defaults_are_supported() -> None:
    settings()


@pytest.mark.parametrize("argv", [["--rpc", "h:1"],
                                  ["--moe-cache-mib", "64"]])
def test_unbuilt_features_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        settings(*argv)
    assert exit_info.value.code == 2
    assert f"{argv[0]} is not supported by llamaq" in capsys.readouterr().err


def test_model_flags_reach_llama_model_params() -> None:
    params = lc.llama_model_default_params()
    tune_model(params, settings("-sm", "tensor", "-lm", "mmap+mlock", "-lzm", "on",
                                "--no-repack", "--no-host", "-ngl", "7", "--check-tensors"))
    assert params.split_mode == lc.LLAMA_SPLIT_MODE_TENSOR
    assert (params.load_mode, params.lazy_mode) == (3, 2)
    assert (params.use_extra_bufts, params.no_host, params.check_tensors) == (False, True, True)
    assert params.n_gpu_layers == 7
    tune_model(params, settings("-lm", "none", "-lzm", "off"))
    assert (params.load_mode, params.lazy_mode, params.use_extra_bufts) == (0, 0, True)
    assert params.split_mode == lc.LLAMA_SPLIT_MODE_LAYER


def test_perf_reaches_llama_context_params() -> None:
    params = lc.llama_context_default_params()
    tune_context(params, settings("--perf"))
    assert params.no_perf is False
    tune_context(params, settings())
    assert params.no_perf is True


def test_sampling_seq_overrides_the_chain() -> None:
    assert sampler_names(settings("--sampling-seq", "kt")) == ["top_k", "temperature"]
    assert sampler_names(settings("--samplers", "top_k;min_p")) == ["top_k", "min_p"]


def test_logit_bias_flag() -> None:
    biases = default_logit_bias(settings("-l", "15043+1", "-l", "2-inf"))
    assert [(b.token, b.bias) for b in biases] == [(15043, 1.0), (2, None)]


@pytest.mark.parametrize(("raw", "text"), [
    ("User:\\n", "User:\n"), ("a\\tb\\r", "a\tb\r"), ("q\\'\\\"\\\\", "q'\"\\"),
    ("\\x41\\x42", "AB"), ("\\xe2\\x82\\xac", "€"), ("\\q", "\\q"), ("\\x4", "\\x4"),
    ("end\\", "end\\"), ("plain", "plain"),
])
def test_escapes_as_llama_cpp_processes_them(raw: str, text: str) -> None:
    assert process_escapes(raw) == text


def test_adapter_and_control_vector_flags_are_read() -> None:
    """--lora and --control-vector take comma lists and repeat; --control-vector-layer-range
    takes two values at once, on the worker and through `llamaq up`'s split."""
    s = settings("--lora", "a.gguf,b.gguf", "--lora", "c.gguf", "--lora-scaled", "d.gguf:0.5",
                 "--lora-init-without-apply", "--control-vector", "v.gguf",
                 "--control-vector-scaled", "w.gguf:0.8", "--control-vector-layer-range", "2",
                 "12")
    assert s.lora == ["a.gguf", "b.gguf", "c.gguf"] and s.lora_scaled == ["d.gguf:0.5"]
    assert s.lora_init_without_apply
    assert (s.control_vector, s.control_vector_scaled) == (["v.gguf"], ["w.gguf:0.8"])
    assert s.control_vector_layer_range == [2, 12]
    argv = ["--control-vector-layer-range", "2", "12", "-c", "512"]
    parts = split_args(argv, [ApiSettings, WorkerSettings])
    assert parts[WorkerSettings] == argv and parts[ApiSettings] == []
    with pytest.raises(SystemExit):
        settings("--control-vector-layer-range", "2")
