

from __future__ import annotations

import gc
import json
import time

import pytest
from pydantic import ValidationError

from api.body import FrozenBodies, load_json
from api.endpoints.native.protocol import CompletionRequest
from scheduler.contract import limits
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, SamplingParams
from worker.engine.textstream import TextStream


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("raw", [
    b'{"temperature": NaN}', b'{"temperature": Infinity}', b'{"temperature": -Infinity}',
    b'{"temperature": 1e999}', b'{"n_predict": ' + b"9" * 5000 + b"}",
    b'{"prompt": "\\ud800"}', b'{"prompt": "a\\udc00b"}', b'{"\\udbff": 1}',
    b'{"prompt": ' + nested(100_000) + b"}", b'{"a": ' + nested(limits.MAX_JSON_DEPTH) + b"}",
])
def test_bodies_llama_server_cannot_read_are_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        load_json(raw)


def test_valid_bodies_pass() -> None:
    assert load_json(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "😀"}
    assert load_json(b'{"prompt": "\\\\ud800"}') == {"prompt": "\\ud800"}
    deep = b'{"a": ' + nested(limits.MAX_JSON_DEPTH - 1) + b"}"
    assert load_json(deep)["a"]
    tokens = json.dumps({"prompt": [[1, 2]] * 1000}).encode()
    assert len(load_json(tokens)["prompt"]) == 1000


def job(**fields: object) -> CompletionJob:
    sampling = {k: v for k, v in fields.items() if k in SamplingParams.model_fields}
    rest = {k: v for k, v in fields.items() if k not in sampling}
    return CompletionJob.model_validate(
        {"model": "m", "prompt": "x", "sampling": SamplingParams.model_validate(sampling), **rest})


@pytest.mark.parametrize("fields", [
    {"n_predict": 2**31}, {"n_predict": -2}, {"n_keep": -2}, {"n_indent": -1},
    {"repeat_last_n": -1}, {"repeat_last_n": 2**31}, {"dry_penalty_last_n": -5},
    {"dry_allowed_length": -1}, {"min_keep": -1}, {"n_cache_reuse": -1},
    {"temperature": float("nan")}, {"top_p": float("inf")}, {"seed": 2**70},
    {"dry_sequence_breakers": []},
    {"dry_sequence_breakers": ["x"] * (limits.MAX_DRY_BREAKERS + 1)},
    {"dry_sequence_breakers": ["x" * (limits.MAX_DRY_BREAKER_LENGTH + 1)]},
    {"stop": ["s"] * (limits.MAX_STOP_STRINGS + 1)},
    {"stop": ["s" * (limits.MAX_STOP_LENGTH + 1)]},
    {"message_delimiters": [{"role": "user", "delimiter": "<u>"}] * 200_000},
    {"message_delimiters": [{"role": "user",
                             "delimiter": "u" * (limits.MAX_MESSAGE_DELIMITER_LENGTH + 1)}]},
    {"grammar": "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000},
    {"grammar": 'root ::= "a"{0,1000000}'},
    {"grammar": "\n".join(f"r{i} ::= r{i + 1}" for i in range(limits.MAX_GRAMMAR_RULES + 1))},
])
def test_hard_limits_are_400_naming_the_field(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        limits.check_completion(job(**fields), limits.DEFAULT_N_PROBS_MAX)
    name = next(iter(fields))
    assert f"'{name}'" in caught.value.message


def test_llama_server_hard_limit_message() -> None:
    with pytest.raises(InvalidRequest) as caught:
        limits.check_completion(job(repeat_last_n=2**31), 100)
    assert caught.value.message == ("Field 'repeat_last_n': Value must be between 0 <= value "
                                    "<= 2147483647, but got 2147483648")


def test_values_at_the_limits_pass_and_n_probs_is_capped() -> None:
    ok = job(n_predict=2**31 - 1, repeat_last_n=2**31 - 1, dry_penalty_last_n=0, n_keep=-1,
             n_probs=10_000_000, stop=["s" * limits.MAX_STOP_LENGTH] * limits.MAX_STOP_STRINGS,
             grammar="root ::= " + "(" * limits.MAX_GRAMMAR_DEPTH + '"a"'
             + ")" * limits.MAX_GRAMMAR_DEPTH)
    limits.check_completion(ok, 100)
    assert ok.n_probs == 100


def test_grammar_shape_skips_literals_classes_and_comments() -> None:
    grammar = 'root ::= ("(((" [(] item{2,5}) # ((((\nitem ::= [a-z]'
    assert limits.grammar_shape(grammar) == (1, 2, 5)


def test_fan_out_is_bounded_before_jobs_exist() -> None:
    with pytest.raises(InvalidRequest):
        limits.check_fan_out(1, 1_000_000, 4)
    with pytest.raises(InvalidRequest):
        limits.check_fan_out(limits.MAX_PROMPTS + 1, 1, 4)
    limits.check_fan_out(2, 4, 4)
    started = time.perf_counter()
    with pytest.raises(InvalidRequest):
        CompletionRequest.model_validate(
            {"prompt": "x", "id_slot": 0, "n_cmpl": 1_000_000}).to_jobs("m")
    assert time.perf_counter() - started < 1


def test_soft_limits_clamp() -> None:
    assert limits.clamp("top_p", 7.5) == 1.0
    assert limits.clamp("min_p", -1.0) == 0.0
    assert limits.clamp("temperature", -3.0) == 0.0
    assert limits.clamp("mirostat", 9) == 2
    assert limits.clamp("top_k", -1) == 0
    assert limits.clamp("adaptive_target", 3.0) == 1.0  # llama-server's set_limits
    assert limits.clamp("adaptive_target", -5.0) == -5.0  # negative: off


def test_adaptive_decay_is_a_hard_limit_in_llama_servers_words() -> None:
    """Measured on the vendored build: 400 "Field 'adaptive_decay': Value must be between
    0.000000 <= value <= 0.990000, but got 1.500000"."""
    with pytest.raises(InvalidRequest) as caught:
        limits.check_sampling(SamplingParams(adaptive_decay=1.5))
    assert str(caught.value) == ("Field 'adaptive_decay': Value must be between 0.000000 <= "
                                 "value <= 0.990000, but got 1.500000")
    limits.check_sampling(SamplingParams(adaptive_decay=0.99, adaptive_target=0.5))


def test_body_limits_per_route() -> None:
    assert limits.body_limit("/tokenize") < limits.body_limit("/completion")
    assert limits.body_limit("/api/tokenize", "/api") == limits.body_limit("/tokenize")
    assert limits.body_limit("/slots/0") == limits.BODY_LIMITS["/slots"]
    assert limits.largest_body_limit() >= limits.DEFAULT_BODY_LIMIT


def test_stop_matching_is_linear_in_the_stop_length() -> None:
    """64 stop strings of 4096 characters that never match: the partial-match check used to
    slice and compare every prefix of every stop for every token (O(L²))."""
    stops = [chr(0x4E00 + i) * limits.MAX_STOP_LENGTH for i in range(limits.MAX_STOP_STRINGS)]
    stream = TextStream(stops)
    started = time.perf_counter()
    for _ in range(1000):  # before: 23 s on the test machine; now: 0.06 s
        assert stream.push(b"ab") == "ab"
    assert time.perf_counter() - started < 2.0


def test_partial_stop_is_held_back_across_pushes() -> None:
    stream = TextStream(["abab", "xyz"])
    assert stream.push(b"zab") == "z"
    assert stream.push(b"a") == ""
    assert stream.push(b"c") == "abac"
    assert stream.push(b"xy") == ""
    assert stream.push(b"abab") == "xy"
    assert stream.stopping_word == "abab"


def test_sse_ping_interval_is_bounded() -> None:
    """1e-9 would make the pod's event loop spin: intervals under 50 ms are refused; 0 and
    -1 mean no pings; outside llama-server's hard limit is a 400."""
    def parse(value: object) -> object:
        return CompletionRequest.model_validate({"prompt": "x", "sse_ping_interval": value})

    assert parse(0.05).sse_ping_interval == 0.05  # type: ignore[attr-defined]
    assert parse(-1).sse_ping_interval == -1  # type: ignore[attr-defined]
    assert parse(0).sse_ping_interval == 0  # type: ignore[attr-defined]
    for bad in (1e-9, 0.049, -2, 2**31, float("inf")):
        with pytest.raises((InvalidRequest, ValidationError)) as raised:
            parse(bad)
        assert "sse_ping_interval" in str(raised.value), bad


def test_a_big_body_is_out_of_the_collectors_walks_while_a_request_holds_it() -> None:
    """Frozen once parsed (the collector never walks it), handed back when the last request
    holding one has ended; the collector runs again after each parse."""
    bodies = FrozenBodies()
    raw = json.dumps([{"text": "hi"}] * 1000).encode()
    assert gc.get_freeze_count() == 0
    first, second = bodies.parse(raw), bodies.parse(raw)
    bodies.hold()
    bodies.hold()
    assert first == second == json.loads(raw)
    assert gc.isenabled()
    assert gc.get_freeze_count() > 1000
    bodies.release()
    assert gc.get_freeze_count() > 1000  # the second request still holds its body
    bodies.release()
    assert gc.get_freeze_count() == 0
