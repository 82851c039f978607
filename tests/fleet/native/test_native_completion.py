"""/completion through the real fleet: Redis, an api process, a worker running Gemma 3 270M."""

from __future__ import annotations

import httpx
import pytest

from tests.fleet.sse import stream_completion

FINAL_FIELDS = {"content", "tokens", "stop", "stop_type", "stopping_word", "model", "prompt",
                "generation_settings", "timings", "tokens_cached", "tokens_evaluated",
                "truncated", "tokens_predicted", "id_slot", "index", "has_new_line"}
GREEDY = {"temperature": 0.0, "seed": 42, "n_predict": 24, "cache_prompt": False}


def complete(api: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{api}/completion", json=body, timeout=120)


def test_completion_has_the_spec_fields(api: str) -> None:
    response = complete(api, {"prompt": "Once upon a time", "n_predict": 32})
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= FINAL_FIELDS
    assert body["stop"] is True
    assert body["model"] == "gemma"
    assert body["prompt"].endswith("Once upon a time")
    assert body["tokens_evaluated"] >= 4
    assert body["tokens_predicted"] == 32 and body["stop_type"] == "limit"
    assert body["truncated"] is False and body["stopping_word"] == ""
    assert body["content"]
    assert body["generation_settings"]["n_predict"] == 32
    timings = body["timings"]
    assert timings["predicted_n"] == 32 and timings["predicted_per_second"] > 0
    assert timings["prompt_n"] + timings["cache_n"] == body["tokens_evaluated"]


def test_alias_path_completions(api: str) -> None:
    response = httpx.post(f"{api}/completions", json={"prompt": "Hi", "n_predict": 2}, timeout=60)
    assert response.status_code == 200
    assert response.json()["tokens_predicted"] == 2


def test_stream_and_non_stream_give_the_same_text(api: str) -> None:
    body = {"prompt": "The three primary colors are", **GREEDY}
    whole = complete(api, body).json()
    events = stream_completion(api, body)
    streamed = "".join(e["content"] for e in events)
    assert streamed == whole["content"]
    assert [t for e in events[:-1] for t in e["tokens"]][: whole["tokens_predicted"]]


def test_same_seed_same_output(api: str) -> None:
    body = {"prompt": "My favourite animal is", "n_predict": 16, "temperature": 1.0,
            "seed": 1234, "cache_prompt": False}
    first = complete(api, body).json()["content"]
    assert complete(api, body).json()["content"] == first


def test_stream_events_follow_the_spec(api: str) -> None:
    events = stream_completion(api, {"prompt": "Once upon a time", "n_predict": 8})
    *partials, final = events
    assert len(partials) == 8
    for event in partials:
        assert set(event) == {"content", "tokens", "stop"}
        assert event["stop"] is False and len(event["tokens"]) == 1
    assert final["stop"] is True
    assert set(final) >= FINAL_FIELDS
    assert final["content"] == "" and final["tokens_predicted"] == 8


def test_stop_strings_end_generation_and_are_not_returned(api: str) -> None:
    base = {"prompt": "Count: one, two, three, four, five, six,", **GREEDY, "n_predict": 40}
    free = complete(api, base).json()["content"]
    assert "," in free, free
    stop = ","
    body = complete(api, {**base, "stop": [stop]}).json()
    assert body["stop_type"] == "word" and body["stopping_word"] == stop
    assert body["content"] == free[: free.index(stop)]
    streamed = stream_completion(api, {**base, "stop": [stop]})
    assert "".join(e["content"] for e in streamed) == body["content"]


def test_return_tokens(api: str) -> None:
    body = complete(api, {"prompt": "Hello", "n_predict": 4, "return_tokens": True}).json()
    assert len(body["tokens"]) == 4 and all(isinstance(t, int) for t in body["tokens"])


def test_token_array_prompt(api: str) -> None:
    tokens = httpx.post(f"{api}/tokenize", json={"content": "Once upon a time",
                                                 "add_special": True}).json()["tokens"]
    by_text = complete(api, {"prompt": "Once upon a time", **GREEDY}).json()
    by_ids = complete(api, {"prompt": tokens, **GREEDY}).json()
    assert by_ids["content"] == by_text["content"]


def test_multiple_prompts_give_an_array_in_order(api: str) -> None:
    body = complete(api, {"prompt": ["Paris is", "Rome is"], **GREEDY, "n_predict": 4}).json()
    assert isinstance(body, list) and [b["index"] for b in body] == [0, 1]
    assert body[0]["prompt"].endswith("Paris is") and body[1]["prompt"].endswith("Rome is")


def test_prompt_longer_than_the_context_is_refused(api: str) -> None:
    response = complete(api, {"prompt": "hello " * 5000, "n_predict": 4})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["code"] == 400
    assert error["n_prompt_tokens"] > error["n_ctx"] > 0


def test_stream_error_before_first_token_is_a_json_error(api: str) -> None:
    response = httpx.post(f"{api}/completion", json={"prompt": "hello " * 5000, "stream": True},
                          timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "exceed_context_size_error"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"prompt": "x", ', "Invalid JSON"),
        (b'["prompt"]', "JSON object"),
        (b"", "JSON object"),
        (b'{"n_predict": 4}', "prompt"),
        (b'{"prompt": 12.5}', "prompt"),
        (b'{"prompt": "x", "n_predict": "many"}', "n_predict"),
        (b'{"prompt": "x", "temperature": "hot"}', "temperature"),
        (b'{"prompt": "x", "stream": "yes"}', "stream"),
        (b'{"prompt": "x", "stop": [1, 2]}', "stop"),
        (b'{"prompt": {"prompt_string": 5}}', "prompt"),
    ],
)
def test_malformed_completion_bodies_are_400(api: str, body: bytes, needle: str) -> None:
    response = httpx.post(f"{api}/completion", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert needle in error["message"]


def test_multimodal_data_without_a_projector_is_a_400(api: str) -> None:
    response = complete(api, {"prompt": {"prompt_string": "x", "multimodal_data": ["AAAA"]}})
    assert response.status_code == 400  # llama-server's words, as a 400 (issue 28)
    assert response.json()["error"]["message"] == \
        "Multimodal data provided, but model does not support multimodal requests."


def test_unknown_route_is_a_404_in_the_spec_format(api: str) -> None:
    response = httpx.get(f"{api}/nope")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_infill_needs_fim_tokens(api: str) -> None:
    response = httpx.post(f"{api}/infill", json={"input_prefix": "def add(a, b):\n",
                                                 "input_suffix": "\n"}, timeout=60)
    assert response.status_code == 501
    error = response.json()["error"]
    assert error["type"] == "not_supported_error"
    assert error["message"].startswith("Infill is not supported by this model")


def test_infill_requires_prefix_and_suffix(api: str) -> None:
    response = httpx.post(f"{api}/infill", json={"input_prefix": "x"}, timeout=60)
    assert response.status_code == 400


def test_samplers_as_letters(api: str) -> None:
    body = complete(api, {"prompt": "Hi", "n_predict": 2, "samplers": "kt"}).json()
    assert body["generation_settings"]["samplers"] == ["top_k", "temperature"]
