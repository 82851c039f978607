"""/v1/completions through the real fleet, with the official `openai` SDK and raw HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 42}


@pytest.fixture(scope="module")
def client(api: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=api + "/v1", api_key="x", max_retries=0, timeout=120)


def sse_payloads(api: str, path: str, body: dict[str, Any]) -> list[Any]:
    """The `data:` payloads of a stream; "[DONE]" is kept as the string."""
    payloads: list[Any] = []
    with httpx.stream("POST", api + path, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line or line.startswith((":", "id: ")):
                continue
            assert line.startswith("data: "), line
            data = line.removeprefix("data: ")
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def test_sdk_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="whatever", prompt="Once upon a time",
                                           max_tokens=6, **GREEDY)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.model == "gemma"
    assert completion.system_fingerprint
    (choice,) = completion.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    assert choice.logprobs is None
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == 6 and usage.prompt_tokens >= 4
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_raw_completion_has_timings(api: str) -> None:
    body = httpx.post(f"{api}/v1/completions", json={"prompt": "Hi", "max_tokens": 3},
                      timeout=60).json()
    assert body["timings"]["predicted_n"] == 3
    assert set(body) >= {"choices", "created", "model", "system_fingerprint", "object", "usage",
                         "id", "timings"}


def test_sdk_stream_matches_non_stream(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": "m", "prompt": "The three primary colors are",
                            "max_tokens": 12, **GREEDY}
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(**args, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_stream_events(api: str) -> None:
    payloads = sse_payloads(api, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
    *chunks, final, done = payloads
    assert done == "[DONE]"
    assert len(chunks) == 4
    ids = {p["id"] for p in [*chunks, final]}
    assert len(ids) == 1
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        assert chunk["choices"][0]["finish_reason"] is None and "usage" not in chunk
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 4 and "timings" in final


def test_stop_string_and_finish_reason(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": "m", "prompt": "Count: one, two, three, four, five,",
                            "max_tokens": 16, **GREEDY}
    free = client.completions.create(**base).choices[0].text
    assert "," in free
    stopped = client.completions.create(**base, stop=",").choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == free[: free.index(",")]
    listed = client.completions.create(**base, stop=[",", "zzz"]).choices[0]
    assert listed.text == stopped.text


def test_n_choices(client: openai.OpenAI, api: str) -> None:
    completion = client.completions.create(model="m", prompt="Hello", max_tokens=3, n=2,
                                           **GREEDY)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].text == completion.choices[1].text
    assert completion.usage is not None and completion.usage.completion_tokens == 6
    payloads = sse_payloads(api, "/v1/completions",
                            {"prompt": "Hello", "max_tokens": 3, "n": 2, **GREEDY})
    finals = [p for p in payloads[:-1] if p["choices"][0]["finish_reason"]]
    assert sorted(p["choices"][0]["index"] for p in finals) == [0, 1]
    texts = ["".join(p["choices"][0]["text"] for p in payloads[:-1]
                     if p["choices"][0]["index"] == i) for i in (0, 1)]
    assert texts[0] == texts[1] == completion.choices[0].text


def test_llama_options_are_accepted(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="m", prompt="Hello", max_tokens=4, seed=3, top_p=0.9, presence_penalty=0.1,
        frequency_penalty=0.1,
        extra_body={"top_k": 5, "min_p": 0.1, "repeat_penalty": 1.1, "mirostat": 0,
                    "n_predict": 2})
    assert completion.usage is not None and completion.usage.completion_tokens == 2


def test_max_tokens_zero_evaluates_the_prompt_only(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="m", prompt="Hello", max_tokens=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 0


def test_grammar(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="m", prompt="Answer:", max_tokens=8, **GREEDY,
        extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert completion.choices[0].text in ("yes", "no")


def test_logprobs(api: str) -> None:
    body = httpx.post(f"{api}/v1/completions", json={"prompt": "Hello", "max_tokens": 2,
                                                     "logprobs": 3, **GREEDY}, timeout=60).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 2
    for token in content:
        assert set(token) >= {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(token["top_logprobs"]) == 3 and token["logprob"] <= 0


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": -5},
        {"prompt": "x", "n": 0},
        {"prompt": "x", "echo": True},
        {"prompt": "x", "best_of": 2},
        {"prompt": "x", "suffix": "y"},
        {"prompt": "x", "max_tokens": "many"},
        {"max_tokens": 3},
        {"prompt": "", "max_tokens": 3},
        {"prompt": "x", "response_format": {"type": "yaml"}},
        {"prompt": "x", "n": 99},
    ],
)
def test_bad_requests_are_400(api: str, body: dict[str, Any]) -> None:
    response = httpx.post(f"{api}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["message"]


def test_malformed_json_is_400(api: str) -> None:
    response = httpx.post(f"{api}/v1/completions", content=b"{not json", timeout=30,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_sdk_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="x", max_tokens=-3)
