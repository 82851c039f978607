"""Worker flags: refused features, --sampling-seq, -l."""

from __future__ import annotations

import pytest

from worker.flags import (
    UnsupportedFlag,
    check_supported,
    default_logit_bias,
    sampler_names,
)
from worker.settings import WorkerSettings


def settings(*argv: str) -> WorkerSettings:
    return WorkerSettings.from_args(list(argv), environ={})


def test_defaults_are_supported() -> None:
    check_supported(settings())


@pytest.mark.parametrize("argv", [["--lora", "x.gguf"], ["--embedding"],
["-ot", "exps=CPU"]])
def test_unbuilt_features_are_refused(argv: list[str]) -> None:
    with pytest.raises(UnsupportedFlag, match="not supported"):
        check_supported(settings(*argv))


def test_sampling_seq_overrides_the_chain() -> None:
    assert sampler_names(settings("--sampling-seq", "kt")) == ["top_k", "temperature"]
    assert sampler_names(settings("--samplers", "top_k;min_p")) == ["top_k", "min_p"]


def test_logit_bias_flag() -> None:
    biases = default_logit_bias(settings("-l", "15043+1", "-l", "2-inf"))
    assert [(b.token, b.bias) for b in biases] == [(15043, 1.0), (2, None)]
