"""Sampler names as llama.cpp's common_sampler_types_from_names reads them: canonical names,
their kebab-case and dashless aliases, the misc aliases, and adaptive-p (letter 'a')."""

from __future__ import annotations

from scheduler.contract.sampling import samplers_from_letters
from worker.engine.sampling import normalize_samplers


def test_aliases() -> None:
    assert normalize_samplers(["top-k", "topk", "min-p", "adaptive-p", "adaptivep",
                               "adaptive_p", "nucleus", "temp", "typ", "TOP_N_SIGMA",
                               "unknown"]) == [
        "top_k", "top_k", "min_p", "adaptive_p", "adaptive_p", "adaptive_p", "top_p",
        "temperature", "typ_p", "top_n_sigma"]
    assert samplers_from_letters("ma") == ["min_p", "adaptive_p"]
