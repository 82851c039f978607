"""Hostile and careless requests on one real fleet (Gemma 3 270M): each is answered at once
with a 400 in the spec's format, or clamped and served, and the worker stays alive."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from scheduler.contract import limits
from tests.processes import Fleet

DEEP = 100_000


def post(api: str, path: str, body: bytes | dict[str, Any], timeout: float = 60) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{api}{path}", content=content, timeout=timeout,
                      headers={"Content-Type": "application/json"})


def assert_error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "type"} and error["code"] == status
    assert error["type"] == ("invalid_request_error" if status == 400 else error["type"])
    return error


def alive(fleet: Fleet) -> bool:
    return all(process.poll() is None for process in fleet.processes)


HOSTILE: list[tuple[str, bytes | dict[str, Any], int]] = [
    ("NaN temperature", b'{"prompt": "x", "n_predict": 1, "temperature": NaN}', 400),
    ("a body nested 100,000 deep",
     b'{"prompt": "x", "a": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400),
    ("a lone surrogate", b'{"prompt": "x\\ud800", "n_predict": 1}', 400),
    ("n_cmpl fan-out on a slot", {"prompt": "x", "id_slot": 0, "n_cmpl": 1_000_000}, 400),
    ("n_cmpl fan-out", {"prompt": "x", "n_cmpl": 1_000_000}, 400),
    ("logit_bias past the vocabulary",
     {"prompt": "x", "n_predict": 2, "logit_bias": [[10**9, 5.0], [-3, 1.0]]}, 200),
    ("n_probs 10,000,000", {"prompt": "x", "n_predict": 2, "n_probs": 10_000_000}, 200),
    ("a grammar nested 60,000 deep",
     {"prompt": "x", "n_predict": 1,
      "grammar": "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000}, 400),
    ("a chain of 60,000 grammar rules",
     {"prompt": "x", "n_predict": 1,
      "grammar": "\n".join(["root ::= r0", *(f"r{i} ::= r{i + 1}" for i in range(60_000)),
                            'r60000 ::= "a"'])}, 400),
    ("a repetition of a million", {"prompt": "x", "n_predict": 1,
                                   "grammar": 'root ::= "a"{1000000}'}, 400),
    ("repeat_last_n 2147483647", {"prompt": "x", "n_predict": 2, "repeat_last_n": 2**31 - 1,
                                  "repeat_penalty": 1.1}, 200),
    ("dry_penalty_last_n 2147483647", {"prompt": "x", "n_predict": 2, "dry_multiplier": 0.8,
                                       "dry_penalty_last_n": 2**31 - 1}, 200),
    ("repeat_last_n past int32", {"prompt": "x", "n_predict": 1, "repeat_last_n": 2**40}, 400),
    ("top_k past int64", {"prompt": "x", "n_predict": 1, "top_k": 10**30}, 400),
    ("seed past uint64", {"prompt": "x", "n_predict": 1, "seed": 10**30}, 400),
    ("a thousand stop strings", {"prompt": "x", "n_predict": 1, "stop": ["a"] * 1000}, 400),
    ("a thousand DRY breakers", {"prompt": "x", "n_predict": 1, "dry_multiplier": 0.5,
                                 "dry_sequence_breakers": ["x"] * 1000}, 400),
    ("200,000 message delimiters",
     {"prompt": "x", "n_predict": 1,
      "message_delimiters": [{"role": "user", "delimiter": "x"}] * 200_000}, 400),
    ("empty DRY breakers", {"prompt": "x", "n_predict": 1, "dry_sequence_breakers": []}, 400),
    ("many prompts", {"prompt": ["x"] * (limits.MAX_PROMPTS + 1), "n_predict": 1}, 400),
    ("a huge integer", b'{"prompt": "x", "n_predict": ' + b"9" * 5000 + b"}", 400),
]


def test_hostile_requests_are_answered_and_the_worker_survives(fleet: Fleet, api: str) -> None:
    """The sequence of the issue (and more) one after another on one fleet."""
    for what, body, status in HOSTILE:
        started = time.monotonic()
        response = post(api, "/completion", body)
        took = time.monotonic() - started
        if status == 200:
            assert response.status_code == 200, (what, response.text[:500])
        else:
            assert_error(response, status)
        assert took < 30, f"{what}: answered after {took:.1f} s"
        assert alive(fleet), f"a process died after: {what}"
    assert httpx.get(f"{api}/health", timeout=10).status_code == 200
    response = post(api, "/completion", {"prompt": "Hello", "n_predict": 2})
    assert response.status_code == 200


def test_n_probs_is_capped_and_clamps_are_reported(api: str) -> None:
    body = post(api, "/completion", {
        "prompt": "The sky is", "n_predict": 1, "n_probs": 10_000_000, "top_p": 7.0,
        "min_p": -2.0, "temperature": -1.0, "mirostat": 9, "xtc_threshold": 3.0,
        "repeat_last_n": 2**31 - 1, "dry_penalty_last_n": 2**31 - 1}).json()
    assert len(body["completion_probabilities"][0]["top_logprobs"]) == limits.DEFAULT_N_PROBS_MAX
    settings = body["generation_settings"]
    n_ctx = httpx.get(f"{api}/props").json()["default_generation_settings"]["n_ctx"]
    assert (settings["top_p"], settings["min_p"], settings["temperature"]) == (1.0, 0.0, 0.0)
    assert (settings["mirostat"], settings["xtc_threshold"]) == (2, 1.0)
    assert settings["repeat_last_n"] == n_ctx and settings["dry_penalty_last_n"] == n_ctx


def test_hard_limit_message_is_llama_servers(api: str) -> None:
    error = assert_error(post(api, "/completion", {"prompt": "x", "n_predict": 2**31}))
    assert error["message"] == ("Field 'n_predict': Value must be between -1 <= value <= "
                                "2147483647, but got 2147483648")


@pytest.mark.parametrize("path", ["/tokenize", "/v1/chat/completions", "/v1/completions",
                                  "/v1/messages", "/infill", "/apply-template"])
def test_every_route_refuses_nan_depth_and_surrogates(api: str, path: str) -> None:
    for body in (b'{"content": NaN}', b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}",
                 b'{"content": "\\udfff", "prompt": "\\udfff", "messages": '
                 b'[{"role": "user", "content": "\\udfff"}]}'):
        assert_error(post(api, path, body))


def test_bodies_past_the_route_limit_are_refused(api: str) -> None:
    big = {"content": "a" * (limits.body_limit("/tokenize") + 10)}
    error = assert_error(post(api, "/tokenize", big))
    assert "/tokenize" in error["message"]


def test_surrogate_pairs_are_fine(api: str) -> None:
    response = post(api, "/tokenize", b'{"content": "\\ud83d\\ude00", "with_pieces": true}')
    assert response.status_code == 200
    assert "".join(t["piece"] for t in response.json()["tokens"]
                   if isinstance(t["piece"], str)) == "😀"


def test_chat_n_and_n_cmpl_are_bounded_before_jobs_exist(api: str) -> None:
    started = time.monotonic()
    assert_error(post(api, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "n_cmpl": 1_000_000}))
    assert_error(post(api, "/v1/completions", {"prompt": "x", "n": 1, "n_cmpl": 1_000_000,
                                               "id_slot": 0}))
    assert time.monotonic() - started < 10


def test_systemone_malformed_is_400_then_well_formed_is_501(api: str) -> None:
    for body in ({}, {"state": "x"}, {"state": "x", "questions": {}},
                 {"state": "x", "questions": {"q": {"type": "maybe", "instructions": "?"}}},
                 {"state": "x", "questions": {"q": {"type": "score", "instructions": "?",
                                                    "criteria": ["only one"]}}},
                 {"state": "x", "questions": {"q": {"type": "choice", "instructions": "?"}}},
                 {"state": "x", "files": ["http://x/y.png"],
                  "questions": {"q": {"type": "noul", "instructions": "?"}}}):
        assert_error(post(api, "/v1/systemone", body))
    response = post(api, "/v1/systemone", {
        "state": "I was charged twice.",
        "questions": {"route": {"type": "choice", "instructions": "Which team?",
                                "criteria": {"billing": None, "shipping": None}},
                      "angry": {"type": "noul", "instructions": "Angry?"},
                      "urgency": {"type": "score", "instructions": "How urgent?",
                                  "criteria": ["later", "now"]}}})
    assert_error(response, 501)


def big_schema(depth: int, width: int) -> dict[str, Any]:
    """A schema as large as real tools send: nested objects, arrays, enums, bounded strings."""
    schema: dict[str, Any] = {"type": "string", "maxLength": 64}
    for level in range(depth):
        schema = {"type": "object", "properties": {
            **{f"field_{level}_{i}": {"type": "string", "enum": [f"v{j}" for j in range(8)]}
               for i in range(width)},
            "count": {"type": "integer", "minimum": 0, "maximum": 1000},
            "items": {"type": "array", "items": {"type": "number"}, "maxItems": 16},
            "child": schema}, "required": ["child"]}
    return schema


def test_the_largest_grammars_llamaq_generates_are_served(api: str) -> None:
    """json_schema and tool grammars (turned into GBNF by the worker) fit the grammar limits."""
    schema = big_schema(depth=12, width=12)
    response = post(api, "/completion", {"prompt": "JSON:", "n_predict": 4,
                                         "json_schema": schema})
    assert response.status_code == 200, response.text[:500]
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": "a tool", "parameters": big_schema(4, 8)}}
        for i in range(32)]
    response = post(api, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "call a tool"}], "tools": tools,
        "tool_choice": "required", "max_tokens": 4})
    assert response.status_code == 200, response.text[:500]
    grammar = "root ::= " + "(" * limits.MAX_GRAMMAR_DEPTH + '"a"' + ")" * \
        limits.MAX_GRAMMAR_DEPTH
    response = post(api, "/completion", {"prompt": "x", "n_predict": 1, "grammar": grammar})
    assert response.status_code == 200, response.text[:500]
    assert response.json()["content"] == "a"
