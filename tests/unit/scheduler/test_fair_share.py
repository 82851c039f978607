"""The cost a job is expected to take in its tenant's fair share (scheduler/fair_share.py)."""

from __future__ import annotations

from scheduler.contract.jobs import CompletionJob, TokenizeJob
from scheduler.fair_share import DEFAULT_PREDICT_ESTIMATE, estimated_cost, fair_args


def test_the_prompt_and_what_it_may_generate() -> None:
    assert estimated_cost(CompletionJob(model="m", prompt="x" * 400, n_predict=50)) == 150
    assert estimated_cost(CompletionJob(model="m", prompt=[1, 2, 3, "abcdefgh"],
                                        n_predict=0)) == 5
    assert estimated_cost(CompletionJob(model="m", prompt="hi")) == DEFAULT_PREDICT_ESTIMATE
    assert estimated_cost(CompletionJob(model="m", prompt="", n_predict=-1)) == \
        DEFAULT_PREDICT_ESTIMATE
    assert estimated_cost(CompletionJob(model="m", prompt="a", n_predict=0)) == 1


def test_the_weight_divides_the_cost_and_no_tenant_is_the_default() -> None:
    job = CompletionJob(model="m", prompt="x" * 40, n_predict=90, tenant="t", weight=4)
    assert fair_args(job) == ("t", 25.0)
    assert fair_args(CompletionJob(model="m", prompt="x", n_predict=9)) == ("default", 9.0)
    assert fair_args(TokenizeJob(model="m", content="x")) == ("default", 1.0)
