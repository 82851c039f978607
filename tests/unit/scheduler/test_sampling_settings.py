"""One sampling declaration from defaults to report: SamplingSettings
(scheduler/contract/jobs.py)."""

from __future__ import annotations

import json

from api.endpoints.native.protocol import CompletionRequest
from scheduler.contract.jobs import SamplingParams, SamplingSettings
from scheduler.contract.results import (
    METRICS_ONLY_LEAVES,
    REPORT_ORDER,
    GenerationSettings,
    TokenBias,
)
from worker.engine.sampling import resolve_sampling


def test_overrides_and_settings_have_the_same_fields() -> None:
    assert list(SamplingParams.model_fields) == list(SamplingSettings.model_fields)
    assert set(SamplingParams.model_fields) <= set(CompletionRequest.model_fields)


def test_a_request_overrides_only_what_it_gives() -> None:
    defaults = SamplingSettings(temperature=0.5, top_k=7, dry_penalty_last_n=-1)
    resolved = resolve_sampling(defaults, SamplingParams(top_k=3, seed=-1), n_ctx=128)
    assert resolved.temperature == 0.5 and resolved.top_k == 3
    assert resolved.seed == 0xFFFFFFFF  # -1: random, as llama.cpp's default seed
    assert resolved.repeat_last_n == 64 and resolved.dry_penalty_last_n == 128  # -1: context
    assert defaults.top_k == 7  # the worker's defaults are not changed


def test_soft_limits_clamp() -> None:
    resolved = resolve_sampling(SamplingSettings(), SamplingParams(top_p=3.0, min_p=-1.0), 64)
    assert resolved.top_p == 1.0 and resolved.min_p == 0.0


def test_the_report_dumps_the_resolved_settings_in_llama_servers_order() -> None:
    sampling = SamplingSettings(top_k=3)
    report = GenerationSettings(**sampling.model_dump(), n_predict=5, stop=["x"], max_tokens=5,
                                n_keep=0, n_discard=2, stream=False, n_probs=4,
                                logit_bias=[TokenBias(token=2, bias=None)],
                                timings_per_token=False, n_ctx=128, model="m")
    data = json.loads(report.model_dump_json())
    assert GenerationSettings.model_validate(data) == report  # through Redis and back
    wire = report.to_wire(full=True)
    assert list(wire) == list(REPORT_ORDER)  # llama-server's keys, in its order, and no more
    assert wire["top_k"] == 3 and wire["n_probs"] == 4 and wire["n_discard"] == 2
    assert wire["logit_bias"] == [{"bias": None, "token": 2}]
    assert wire["speculative.types"] == "none" and "model" not in wire and "n_ctx" not in wire
    short = report.to_wire(full=False)  # /slots, /props
    assert list(short) == [k for k in REPORT_ORDER if k not in METRICS_ONLY_LEAVES]
    assert "stop" not in short and "dry_sequence_breakers" not in short
