"""The `priority` request field (issue 47): read by every completion-like endpoint, bounded,
and resolved against its tenant's default and cap before a job is queued (api/fleet.py
request_priority)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.endpoints.anthropic.protocol import MessagesRequest
from api.endpoints.native.protocol import CompletionRequest, InfillRequest
from api.endpoints.openai.protocol import ChatCompletionRequest, OpenAICompletionRequest
from api.fleet import request_priority
from api.tenants.config import parse_tenants
from scheduler.contract import limits
from scheduler.contract.errors import InvalidRequest


def test_every_completion_endpoint_carries_it_to_the_job() -> None:
    assert CompletionRequest.model_validate(
        {"prompt": "hi", "priority": 7}).to_jobs("m")[0].priority == 7
    assert CompletionRequest.model_validate({"prompt": "hi"}).to_jobs("m")[0].priority is None
    assert InfillRequest.model_validate(
        {"input_prefix": "a", "input_suffix": "b", "priority": -3}).to_jobs("m")[0].priority == -3
    assert OpenAICompletionRequest.model_validate(
        {"prompt": "hi", "priority": 2}).to_jobs("m")[0].priority == 2
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "priority": 4})
    assert chat.job("m", "prompt").priority == 4
    messages = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
         "priority": 5})
    assert messages.to_job("m", "prompt").priority == 5


@pytest.mark.parametrize("bad", ["1", 1.5, True, [1]])
def test_a_priority_that_is_not_an_integer_is_refused(bad: object) -> None:
    with pytest.raises(ValidationError, match="priority"):
        CompletionRequest.model_validate({"prompt": "hi", "priority": bad})


def test_a_priority_out_of_range_is_a_400_naming_it() -> None:
    job = CompletionRequest.model_validate({"prompt": "hi", "priority": 2**40}).to_jobs("m")[0]
    with pytest.raises(InvalidRequest, match="Field 'priority'"):
        limits.check_completion(job, 10)


def test_the_tenant_gives_the_default_and_the_cap() -> None:
    tenants = parse_tenants(
        b'{"tenants": [{"name": "a", "keys": ["k"], "default_priority": 5, "min_priority": 2},'
        b' {"name": "b", "keys": ["kb"]}]}', "t.json").tenants
    capped, free = tenants
    assert request_priority(None, capped) == 5
    assert request_priority(2, capped) == 2 and request_priority(9, capped) == 9
    with pytest.raises(InvalidRequest, match="tenant 'a' may ask priority 2 or higher"):
        request_priority(1, capped)
    assert request_priority(None, free) == 0 and request_priority(-100, free) == -100
    assert request_priority(None, None) == 0 and request_priority(-4, None) == -4


def test_a_tenant_default_below_its_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="default_priority is below min_priority"):
        parse_tenants(b'{"tenants": [{"name": "a", "keys": ["k"], "default_priority": 0,'
                      b' "min_priority": 1}]}', "t.json")
