"""/completion options that shape sampling and output: probabilities, grammars, biases,
several completions, progress, determinism."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema

from tests.fleet.sse import stream_completion

GREEDY = {"temperature": 0.0, "n_predict": 12, "cache_prompt": False}


def complete(api: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{api}/completion", json=body, timeout=120)


def test_n_probs_pre_sampling(api: str) -> None:
    body = complete(api, {"prompt": "The sky is", **GREEDY, "n_predict": 3, "n_probs": 5}).json()
    probs = body["completion_probabilities"]
    assert len(probs) == 3
    for entry in probs:
        assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 5
        assert entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert all(set(t) == {"id", "token", "bytes", "logprob"} for t in top)
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["id"] == entry["id"]  # greedy picks the most probable token
    assert "".join(e["token"] for e in probs) == body["content"]


def test_n_probs_post_sampling(api: str) -> None:
    body = complete(api, {"prompt": "The sky is", "n_predict": 3, "n_probs": 4, "top_k": 3,
                          "post_sampling_probs": True, "seed": 3}).json()
    for entry in body["completion_probabilities"]:
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"}
        assert 0 < entry["prob"] <= 1
        assert 1 <= len(entry["top_probs"]) <= 3  # top_k leaves three candidates
        assert math.isclose(sum(t["prob"] for t in entry["top_probs"]), 1.0, rel_tol=1e-3)


def test_n_probs_in_a_stream(api: str) -> None:
    events = stream_completion(api, {"prompt": "Hello", "n_predict": 2, "n_probs": 2})
    assert all(len(e["completion_probabilities"]) == 1 for e in events[:-1])
    assert "completion_probabilities" not in events[-1]


def test_json_schema_output_validates(api: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    body = complete(api, {"prompt": "A person as JSON:", "json_schema": schema,
                          "n_predict": 64, "temperature": 0.7, "seed": 5}).json()
    assert body["stop_type"] == "eos", body
    jsonschema.validate(json.loads(body["content"]), schema)


def test_grammar_constrains_output(api: str) -> None:
    grammar = 'root ::= ("yes" | "no") "."'
    body = complete(api, {"prompt": "Is water wet?", "grammar": grammar, "n_predict": 8,
                          "seed": 1}).json()
    assert body["content"] in ("yes.", "no.")


def test_bad_grammar_is_400(api: str) -> None:
    response = complete(api, {"prompt": "x", "grammar": "root ::= ( unclosed"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "Failed to parse grammar"


def test_logit_bias_bans_a_token(api: str) -> None:
    free = complete(api, {"prompt": "One, two, three,", **GREEDY, "n_predict": 1,
                          "return_tokens": True}).json()
    banned = free["tokens"][0]
    for bias in ([[banned, False]], {str(banned): -1000}):
        body = complete(api, {"prompt": "One, two, three,", **GREEDY, "n_predict": 1,
                              "return_tokens": True, "logit_bias": bias}).json()
        assert body["tokens"][0] != banned


def test_response_fields(api: str) -> None:
    body = complete(api, {"prompt": "Hi", "n_predict": 2,
                          "response_fields": ["content", "generation_settings/n_predict",
                                              "nope"]}).json()
    assert set(body) == {"content", "generation_settings/n_predict"}
    assert body["generation_settings/n_predict"] == 2


def test_n_cmpl(api: str) -> None:
    body = complete(api, {"prompt": "Once", "n_predict": 4, "n_cmpl": 3, "seed": 7}).json()
    assert [b["index"] for b in body] == [0, 1, 2]
    too_many = complete(api, {"prompt": "Once", "n_cmpl": 9})
    assert too_many.status_code == 400


def test_return_progress(api: str) -> None:
    events = stream_completion(api, {"prompt": "word " * 40, "n_predict": 2,
                                     "return_progress": True, "cache_prompt": False})
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] > 40


def test_n_predict_zero_evaluates_the_prompt_only(api: str) -> None:
    body = complete(api, {"prompt": "Just cache me", "n_predict": 0}).json()
    assert body["content"] == "" and body["tokens_predicted"] == 0
    assert body["stop_type"] == "limit"


def test_seeds(api: str) -> None:
    base = {"prompt": "Tell me about cats.", "n_predict": 16, "temperature": 1.5,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "cache_prompt": False}
    a = complete(api, {**base, "seed": 1}).json()["content"]
    assert complete(api, {**base, "seed": 1}).json()["content"] == a
    assert complete(api, {**base, "seed": 2}).json()["content"] != a


def test_n_indent_stops_at_a_less_indented_line(api: str) -> None:
    body = {"prompt": 'def add(a, b):\n    """Add two numbers."""\n', **GREEDY, "n_predict": 60}
    free = complete(api, body).json()["content"]
    first, second = free.split("\n")[:2]
    indent = len(second) - len(second.lstrip(" \t"))
    assert second.strip() and indent < 8, free
    cut = complete(api, {**body, "n_indent": 8}).json()
    # Cut before the first character of the first line indented less than 8.
    assert cut["content"] == free[: len(first) + 1 + indent]
    assert cut["stop_type"] == "limit" and cut["tokens_predicted"] < 60


def test_n_cmpl_evaluates_the_prompt_once(api: str) -> None:
    prompt = "A long shared prompt about the history of tea in many countries. " * 6
    body = complete(api, {"prompt": prompt, "n_predict": 4, "n_cmpl": 3, "seed": 3}).json()
    cached = sorted(b["timings"]["cache_n"] for b in body)
    n_prompt = body[0]["tokens_evaluated"]
    assert cached[1:] == [n_prompt - 1, n_prompt - 1], cached  # copied, not evaluated again
