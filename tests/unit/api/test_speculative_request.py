"""A request's speculative.n_max / n_min / p_min (the spec's field names) reach the job,
clamped as llama-server clamped them (0 <= n_min <= n_max); absent: the worker's flags alone."""

from __future__ import annotations

import pytest

from api.endpoints.native.protocol import CompletionRequest
from api.endpoints.openai.protocol import ChatCompletionRequest
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import DraftLimits


def test_the_fields_reach_the_job_clamped() -> None:
    body = {"prompt": "x", "speculative.n_max": 4, "speculative.n_min": 9,
            "speculative.p_min": 0.0}
    job = CompletionRequest.model_validate(body).job("m", "x")
    assert job.draft_limits == DraftLimits(n_max=4, n_min=4, p_min=0.0)
    negative = {"prompt": "x", "speculative.n_max": -3, "speculative.n_min": -1}
    assert CompletionRequest.model_validate(negative).job("m", "x").draft_limits == \
        DraftLimits(n_max=0, n_min=0)


def test_absent_fields_leave_the_worker_alone() -> None:
    assert CompletionRequest.model_validate({"prompt": "x"}).job("m", "x").draft_limits is None


def test_the_openai_bodies_take_them_too() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "speculative.n_max": 8}
    request = ChatCompletionRequest.model_validate(body)
    assert request.job("m", "x").draft_limits == DraftLimits(n_max=8)


def test_p_min_is_a_probability() -> None:
    """p_min bounds a draft model's tokens (draft-simple): taken in [0, 1], refused outside."""
    request = CompletionRequest.model_validate({"prompt": "x", "speculative.p_min": 0.75})
    assert request.job("m", "x").draft_limits == DraftLimits(p_min=0.75)
    request = CompletionRequest.model_validate({"prompt": "x", "speculative.p_min": 1.5})
    with pytest.raises(InvalidRequest, match=r"speculative\.p_min must be between 0 and 1"):
        request.job("m", "x")
