"""CompletionRequest: llama-server's prompt shapes, strict field types, conversion to jobs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.endpoints.anthropic.protocol import MessagesRequest
from api.endpoints.native.protocol import SAMPLING_FIELDS, CompletionRequest
from api.endpoints.openai.protocol import OpenAICompletionRequest
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import LoraScale, SamplingParams


def request(**body: Any) -> CompletionRequest:
    return CompletionRequest.model_validate(body)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("s", ["s"]),
        ([1, 2, "s"], [[1, 2, "s"]]),
        ([1, 2], [[1, 2]]),
        (["a", "b"], ["a", "b"]),
        ([[1, 2], [3]], [[1, 2], [3]]),
        ({"prompt_string": "x"}, ["x"]),
        (["a", {"prompt_string": "b"}], ["a", "b"]),
        (["a", [1, "b"]], ["a", [1, "b"]]),
    ],
)
def test_prompt_shapes(prompt: Any, expected: list[Any]) -> None:
    assert request(prompt=prompt).prompts() == expected


def test_one_job_per_prompt() -> None:
    jobs = request(prompt=["a", [1, 2], {"prompt_string": "c"}]).to_jobs("m")
    assert [job.prompt for job in jobs] == ["a", [1, 2], "c"]
    assert {job.model for job in jobs} == {"m"}
    assert len({job.job_id for job in jobs}) == 3


def test_every_sampling_field_is_a_request_field() -> None:
    assert set(SAMPLING_FIELDS) == set(SamplingParams.model_fields)
    assert set(SAMPLING_FIELDS) <= set(CompletionRequest.model_fields)


def test_to_jobs_carries_sampling_and_request_fields() -> None:
    body = {
        "prompt": "hi", "stream": True, "n_predict": 7, "stop": ["\n"], "cache_prompt": False,
        "return_tokens": True, "id_slot": 1, "n_keep": 3, "t_max_predict_ms": 50,
        "timings_per_token": True, "temperature": 0.25, "top_k": 5, "top_p": 0.5, "seed": 42,
        "dry_sequence_breakers": ["x"], "samplers": ["top_k", "temperature"],
        "ignore_eos": True, "mirostat": 2, "min_keep": 1,
    }
    (job,) = request(**body).to_jobs("gemma")
    assert job.model == "gemma"
    assert job.prompt == "hi"
    assert (job.stream, job.n_predict, job.stop) == (True, 7, ["\n"])
    assert (job.cache_prompt, job.return_tokens, job.id_slot) == (False, True, 1)
    assert (job.n_keep, job.t_max_predict_ms, job.timings_per_token) == (3, 50, True)
    sampling = job.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.25, 5, 0.5)
    assert (sampling.seed, sampling.ignore_eos, sampling.mirostat) == (42, True, 2)
    assert sampling.dry_sequence_breakers == ["x"]
    assert sampling.samplers == ["top_k", "temperature"]
    assert sampling.min_keep == 1
    assert sampling.repeat_penalty is None  # unset: the worker's default applies


def test_defaults_leave_everything_to_the_worker() -> None:
    (job,) = request(prompt="hi").to_jobs("m")
    assert job.n_predict is None
    assert job.cache_prompt is None
    assert job.id_slot == -1
    assert job.stop == []
    assert job.sampling == SamplingParams()


def test_stop_as_a_string_becomes_a_list() -> None:
    assert request(prompt="p", stop="END").stop == ["END"]
    assert request(prompt="p", stop=["a", "b"]).stop == ["a", "b"]
    (job,) = request(prompt="p", stop="END").to_jobs("m")
    assert job.stop == ["END"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_predict", "5"),
        ("n_predict", 5.0),
        ("n_predict", -2),
        ("stream", "true"),
        ("stream", 1),
        ("temperature", "0.5"),
        ("top_k", 1.5),
        ("seed", True),
        ("stop", [1]),
        ("id_slot", "0"),
    ],
)
def test_wrong_types_are_rejected(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        request(prompt="p", **{field: value})


def test_int_is_accepted_for_float_fields() -> None:
    req = request(prompt="p", temperature=1, top_p=1)
    assert req.temperature == 1.0
    assert isinstance(req.temperature, float)
    assert request(prompt="p", n_predict=-1).n_predict == -1


def test_unknown_fields_are_ignored() -> None:
    assert request(prompt="p", no_such_field=1, model="x").prompts() == ["p"]


def test_bad_prompts_are_rejected() -> None:
    with pytest.raises(ValidationError):
        request(prompt=1.5)
    with pytest.raises(ValidationError):
        request(prompt={"prompt_string": "x", "other": 1})
    with pytest.raises(ValidationError):
        request()


def test_multimodal_data_is_read_per_prompt() -> None:
    """Each prompt's media, in the order of the prompts (api/media/prompts.py reads them into
    its jobs; the worker pairs them with the prompt's markers)."""
    req = request(prompt={"prompt_string": "x", "multimodal_data": ["aGk="]})
    assert req.prompts() == ["x"] and req.prompt_media() == [["aGk="]]
    mixed = request(prompt=["a", {"prompt_string": "b", "multimodal_data": ["aGk=", "aGk="]}])
    assert mixed.prompts() == ["a", "b"] and mixed.prompt_media() == [[], ["aGk=", "aGk="]]
    assert request(prompt=["a", "b"]).prompt_media() == [[], []]


def test_empty_multimodal_data_is_plain_text() -> None:
    assert request(prompt={"prompt_string": "x", "multimodal_data": []}).prompts() == ["x"]


@pytest.mark.parametrize(
    "prompt", ["", [], [[]], ["a", ""], {"prompt_string": ""}, [[1], []]],
)
def test_empty_prompt_is_invalid(prompt: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        request(prompt=prompt).to_jobs("m")
    assert info.value.status == 400


def test_lora_is_read_as_llama_server_reads_it() -> None:
    """Issue 21: `lora` was accepted and ignored. Absent or `[]` is the global scales (None on
    the job); entries become {id, scale} as parse_lora_request reads them (id -1 and scale 0
    when missing or of another type, the last entry of an id wins), on the native, OpenAI and
    Anthropic bodies; anything but an array is a 400."""
    plain = CompletionRequest.model_validate({"prompt": "x"}).to_jobs("m")[0]
    empty: tuple[list[Any] | None, ...] = ([], None)
    for lora in empty:
        job = CompletionRequest.model_validate({"prompt": "x", "lora": lora}).to_jobs("m")[0]
        assert job.model_dump(exclude={"job_id"}) == plain.model_dump(exclude={"job_id"})
        assert job.lora is None
    given = [{"id": 1, "scale": 0.5}, {"id": 7}, {"scale": 2}, {"id": "0", "scale": "x"},
             {"id": 1, "scale": 0.25}]
    want = [LoraScale(id=-1, scale=0.0), LoraScale(id=1, scale=0.25), LoraScale(id=7, scale=0.0)]
    assert CompletionRequest.model_validate(
        {"prompt": "x", "lora": given}).to_jobs("m")[0].lora == want
    assert OpenAICompletionRequest.model_validate(
        {"prompt": "x", "lora": [{"id": 0, "scale": 1}]}).to_jobs("m")[0].lora == \
        [LoraScale(id=0, scale=1.0)]
    messages = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
         "lora": [{"id": 0, "scale": 0.5}]})
    assert messages.to_job("m", "hi").lora == [LoraScale(id=0, scale=0.5)]
    for bad in ({"id": 0, "scale": 1}, "0:1", 3):
        with pytest.raises(ValidationError, match="'lora' must be an array"):
            CompletionRequest.model_validate({"prompt": "x", "lora": bad})
    huge = CompletionRequest.model_validate({"prompt": "x", "lora": [{"id": 0,
                                                                      "scale": 10 ** 400}]})
    with pytest.raises(InvalidRequest, match="out of range"):
        huge.to_jobs("m")
