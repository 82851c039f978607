"""Every limit on what a request may ask, in one place (the README's limits table).

llama-server's own table (tools/server/server-schema.cpp): hard limits answer 400, soft limits
clamp. llamaq adds its own where llama-server has none (a fleet serves many users at once: one
request must not crash a worker or slow every slot); each is a documented deviation.

The api checks a job with `check_completion` before it exists on Redis; the worker checks it
again (and clamps what needs the model: context size, vocabulary) before llama.cpp sees it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from scheduler.contract import keys
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, DecisionJob
from scheduler.contract.message_delimiters import MessageDelimiter
from scheduler.contract.sampling import SamplingParams

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT32_MASK = 0xFFFFFFFF
FLT_MAX = 3.4028234663852886e38

HARD_LIMITS: dict[str, tuple[float, float]] = {
    "n_predict": (-1, INT32_MAX),
    "n_indent": (0, INT32_MAX),
    "n_keep": (-1, INT32_MAX),
    "n_discard": (0, INT32_MAX),
    "n_cache_reuse": (0, INT32_MAX),
    "t_max_predict_ms": (-1, INT64_MAX),
    "repeat_last_n": (0, INT32_MAX),
    "dry_allowed_length": (0, INT32_MAX),
    "dry_penalty_last_n": (0, INT32_MAX),
    "min_keep": (0, INT32_MAX),
    "sse_ping_interval": (-1, INT32_MAX),
    "priority": (-INT32_MAX - 1, INT32_MAX),
    "adaptive_decay": (0.0, 0.99),
}
"""llama-server's hard limits (400 outside them), by request field."""

SOFT_LIMITS: dict[str, tuple[float, float]] = {
    "top_k": (0, INT32_MAX),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "xtc_probability": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0),
    "temperature": (0.0, math.inf),
    "mirostat": (0, 2),
    "adaptive_target": (-FLT_MAX, 1.0),
}
"""llama-server's soft limits: a value outside is clamped into the range."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""A seed is a uint32 in llama.cpp; anything a 64-bit integer holds is taken modulo 2**32."""

# llamaq's own limits (llama-server has none)
QUICK_QUEUE_MAX = 256
"""Jobs waiting in a model's utility queue (tokenize, detokenize, apply-template) and in its
online embedding queue: past it 503 with Retry-After (Redis memory stays bounded)."""
DEFAULT_N_PROBS_MAX = 100
"""n_probs (and logprobs/top_logprobs) is capped at this (--n-probs-max)."""
MAX_GRAMMAR_BYTES = 1 << 20
"""A GBNF grammar's size (also the grammar a json_schema turns into)."""
MAX_GRAMMAR_DEPTH = 256
"""Nesting of parentheses in a grammar (llama.cpp's grammar parser recurses on each)."""
MAX_GRAMMAR_RULES = 4096
"""Rules in a grammar (llama.cpp recurses along chains of rule references)."""
GRAMMAR_TOKENS = re.compile(
    r'"(?:[^"\\\n]|\\.)*"?|\[(?:[^\]\\\n]|\\.)*\]?|#[^\n]*|[()]|\{[\s\d,]*\}')
"""What matters to the shape of GBNF: literals and comments (skipped whole), parentheses and
repetitions `{m,n}`."""
MAX_GRAMMAR_REPEAT = 2000
"""The bounds of a repetition `x{m,n}`: llama.cpp expands it into that many rules (and refuses
more than 2000 itself)."""
MAX_STOP_STRINGS = 64
MAX_STOP_LENGTH = 4096
"""Characters in one stop string."""
MAX_DRY_BREAKERS = 64
MAX_DRY_BREAKER_LENGTH = 256
MAX_MESSAGE_DELIMITERS = 64
"""Entries of message_delimiters (a chat template makes two)."""
MAX_MESSAGE_DELIMITER_LENGTH = 1024
"""Characters of one message delimiter."""
MAX_LOGIT_BIAS = 65536
"""Entries of logit_bias."""
MAX_PROMPTS = 512
"""Prompts in one request (times n_cmpl: jobs per request)."""
LOOKUP_CACHE_MAX_BYTES = 32 << 20
"""The fleet's -lcd lookup cache file (worker/speculative/lookup_share.py): past it a save
keeps the n-grams seen most often, in three quarters of it."""
LOOKUP_UNSAVED_MAX_TOKENS = 1 << 20
"""Tokens a worker keeps for the -lcd cache's next save while saves fail (the oldest go)."""
MAX_EMBEDDING_INPUTS = 2048
"""Inputs of one embedding request, and documents of one rerank (OpenAI's limit); larger sets go
through the Batch API."""
MAX_DECISION_QUESTIONS = 256
"""Questions in one /v1/systemone request."""
MAX_DECISION_OPTIONS = 255
"""Options of a choice question (the spec's limit for most decision models; a native model's
file may lower it)."""
MAX_DECISION_TEXT = 1 << 20
"""Characters of a decision prompt: the state and the text of all questions, rendered."""
MAX_JSON_DEPTH = 128
"""Nesting of arrays and objects in a request body."""
DEFAULT_BODY_LIMIT = 32 << 20
BODY_LIMITS: dict[str, int] = {
    "/tokenize": 8 << 20,
    "/detokenize": 8 << 20,
    "/apply-template": 8 << 20,
    "/v1/chat/completions/control": 1 << 16,
    "/v1/systemone": 32 << 20,
    "/slots": 1 << 16,
    "/lora-adapters": 1 << 16,
    "/props": 1 << 16,
}
"""Bytes of a request body, by route (the default for every other POST route)."""


MAX_REQUEST_JOB_BYTES = DEFAULT_BODY_LIMIT
"""Bytes of JSON of all the completion jobs one request makes (each of `n_cmpl` choices carries
its own copy of the prompt on Redis while it waits and runs): past it 413."""
REQUEST_EVENT_LOG_MAX_BYTES = 16 << 20
"""Bytes of events the logs of one request's jobs keep together on Redis (each job's share at
most keys.EVENT_LOG_MAX_BYTES, at least JOB_EVENT_LOG_MIN_BYTES)."""
JOB_EVENT_LOG_MIN_BYTES = 64 << 10


def budget_request(jobs: Sequence[CompletionJob]) -> None:
    """What one request's jobs may hold on Redis: their payloads together (check_request_bytes)
    and each its share of REQUEST_EVENT_LOG_MAX_BYTES for its event log."""
    check_request_bytes(jobs)
    share = REQUEST_EVENT_LOG_MAX_BYTES // max(len(jobs), 1)
    for job in jobs:
        job.event_log_max_bytes = max(JOB_EVENT_LOG_MIN_BYTES,
                                      min(keys.EVENT_LOG_MAX_BYTES, share))


def check_request_bytes(jobs: Sequence[CompletionJob]) -> None:
    """The jobs of one request fit MAX_REQUEST_JOB_BYTES, else 413 (ours: llama-server holds
    one copy of a prompt in its own memory). A request of one job passes (the body limit
    bounded it; a chat template may render a little more); jobs that share a prompt are
    measured once."""
    if len(jobs) < 2:
        return
    sizes: dict[int, int] = {}
    total = 0
    for job in jobs:
        key = id(job.prompt)
        if key not in sizes:
            sizes[key] = len(job.model_dump_json())
        total += sizes[key]
    if total > MAX_REQUEST_JOB_BYTES:
        raise InvalidRequest(
            f"The request's {len(jobs)} completions carry {total} bytes of prompt and "
            f"settings (at most {MAX_REQUEST_JOB_BYTES} in all): ask for fewer choices of a "
            "long prompt", status=413)


def body_limit(path: str, api_prefix: str = "") -> int:
    route = path[len(api_prefix):] if api_prefix and path.startswith(api_prefix) else path
    if route.startswith("/slots/"):
        route = "/slots"
    return BODY_LIMITS.get(route, DEFAULT_BODY_LIMIT)


def largest_body_limit() -> int:
    return max(DEFAULT_BODY_LIMIT, *BODY_LIMITS.values())


def _range_error(name: str, low: float, high: float, got: object) -> InvalidRequest:
    if isinstance(low, float):  # std::to_string of a float field
        return InvalidRequest(f"Field '{name}': Value must be between {low:f} <= value <= "
                              f"{high:f}, but got {got:f}")
    return InvalidRequest(f"Field '{name}': Value must be between {low} <= value <= {high}, "
                          f"but got {got}")


def check_range(name: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not low <= value <= high:
        raise _range_error(name, low, high, value)


MIN_PING_S = 0.05
"""The shortest `sse_ping_interval` a request may ask for (fractions of a second are ours;
llama-server reads whole seconds): a ping every 1e-9 s would spin the pod's event loop."""


def ping_seconds(value: float | None) -> float | None:
    """A request's `sse_ping_interval`: -1 ... 2147483647 (llama-server's hard limit), and
    not in (0, MIN_PING_S); else 400. 0 and -1 send no pings."""
    if value is None:
        return None
    low, high = HARD_LIMITS["sse_ping_interval"]
    if not (math.isfinite(value) and low <= value <= high):
        raise _range_error("sse_ping_interval", low, high, value)
    if 0 < value < MIN_PING_S:
        raise InvalidRequest(f"Field 'sse_ping_interval': at least {MIN_PING_S} s, or 0 or -1 "
                             f"for no pings, but got {value}")
    return value


def check_fan_out(n_prompts: int, n_cmpl: int, n_slots: int) -> None:
    """n_cmpl is 1..-np of the worker that runs the group (llama-server's hard limit); the
    jobs of one request are bounded (ours). Checked before any job is made."""
    if n_cmpl < 1 or n_cmpl > n_slots:
        raise _range_error("n_cmpl", 1, n_slots, n_cmpl)
    if n_prompts > MAX_PROMPTS:
        raise InvalidRequest(f"Too many prompts: {n_prompts} (at most {MAX_PROMPTS})")
    if n_prompts * n_cmpl > MAX_PROMPTS:
        raise InvalidRequest(f"Too many completions: {n_prompts} prompts times n_cmpl {n_cmpl} "
                             f"(at most {MAX_PROMPTS})")


def check_completion(job: CompletionJob, n_probs_max: int) -> None:
    """llama-server's hard limits and llamaq's own on a completion job; caps n_probs.
    Raises InvalidRequest (400) naming the field."""
    for name in ("n_predict", "n_indent", "n_keep", "n_discard", "n_cache_reuse",
                 "t_max_predict_ms", "priority"):
        check_range(name, getattr(job, name), *HARD_LIMITS[name])
    check_sampling(job.sampling)
    check_strings("stop", job.stop, MAX_STOP_STRINGS, MAX_STOP_LENGTH)
    check_message_delimiters(job.message_delimiters)
    if len(job.logit_bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"Field 'logit_bias': at most {MAX_LOGIT_BIAS} entries")
    for bias in job.logit_bias:
        if bias.bias is not None and not math.isfinite(bias.bias):
            raise InvalidRequest("Field 'logit_bias': a bias must be a finite number or false")
    if job.grammar:
        check_grammar(job.grammar)
    if job.json_schema is not None and len(job.json_schema) > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(f"Field 'json_schema': larger than {MAX_GRAMMAR_BYTES} bytes")
    job.n_probs = max(0, min(job.n_probs, n_probs_max))


def check_message_delimiters(delimiters: list[MessageDelimiter]) -> None:
    """At most MAX_MESSAGE_DELIMITERS of MAX_MESSAGE_DELIMITER_LENGTH characters (ours): the
    worker tokenizes each and searches the prompt for them before any slot decodes."""
    check_count("message_delimiters", len(delimiters), MAX_MESSAGE_DELIMITERS)
    check_strings("message_delimiters", [d.delimiter for d in delimiters],
                  MAX_MESSAGE_DELIMITERS, MAX_MESSAGE_DELIMITER_LENGTH)


def check_count(name: str, count: int, max_count: int) -> None:
    """A list field's length (checked by the wire models before their items are read)."""
    if count > max_count:
        raise InvalidRequest(f"Field '{name}': at most {max_count} entries, got {count}")


def check_sampling(sampling: SamplingParams) -> None:
    for name, value in sampling:
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"Field '{name}': must be a finite number, got {value}")
        if name in HARD_LIMITS:
            check_range(name, value, *HARD_LIMITS[name])
    check_range("seed", sampling.seed, *SEED_RANGE)
    check_range("top_k", sampling.top_k, -(2**63), INT64_MAX)
    check_range("mirostat", sampling.mirostat, -(2**63), INT64_MAX)
    breakers = sampling.dry_sequence_breakers
    if breakers is not None:
        if not breakers:
            raise InvalidRequest("Field 'dry_sequence_breakers': Error: dry_sequence_breakers "
                                 "must be a non-empty array of strings")
        check_strings("dry_sequence_breakers", breakers, MAX_DRY_BREAKERS,
                      MAX_DRY_BREAKER_LENGTH)


def check_strings(name: str, values: list[str], max_count: int, max_length: int) -> None:
    if len(values) > max_count:
        raise InvalidRequest(f"Field '{name}': at most {max_count} strings, got {len(values)}")
    for value in values:
        if len(value) > max_length:
            raise InvalidRequest(f"Field '{name}': a string is longer than {max_length} "
                                 "characters")


def clamp(name: str, value: Any) -> Any:
    """A soft limit applied to one value (llama-server's set_limits)."""
    low, high = SOFT_LIMITS[name]
    clamped = max(low, min(high, value))
    return type(value)(clamped)


def check_grammar(grammar: str, field: str = "grammar") -> None:
    """Size, parenthesis nesting, rule count and repetition bounds of a GBNF grammar, before
    llama.cpp's recursive parser sees it."""
    if len(grammar) > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(f"Field '{field}': larger than {MAX_GRAMMAR_BYTES} bytes")
    depth, rules, repeat = grammar_shape(grammar)
    if depth > MAX_GRAMMAR_DEPTH:
        raise InvalidRequest(f"Field '{field}': nested {depth} levels deep (at most "
                             f"{MAX_GRAMMAR_DEPTH})")
    if rules > MAX_GRAMMAR_RULES:
        raise InvalidRequest(f"Field '{field}': {rules} rules (at most {MAX_GRAMMAR_RULES})")
    if repeat > MAX_GRAMMAR_REPEAT:
        raise InvalidRequest(f"Field '{field}': a repetition of {repeat} (at most "
                             f"{MAX_GRAMMAR_REPEAT})")


def grammar_shape(grammar: str) -> tuple[int, int, int]:
    """(deepest parenthesis nesting, `::=` rule definitions, largest repetition bound) of GBNF
    text; string literals, character classes and comments do not count."""
    depth = deepest = repeat = 0
    for match in GRAMMAR_TOKENS.finditer(grammar):
        token = match.group()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token == ")":
            depth -= 1
        elif token[0] == "{":
            repeat = max(repeat, *(int(b) for b in re.findall(r"\d+", token)), 0)
    return deepest, grammar.count("::="), repeat


def check_decision(job: DecisionJob) -> None:
    """The bounds of a decision job (the api's wire model checks them on the request first)."""
    if len(job.questions) > MAX_DECISION_QUESTIONS:
        raise InvalidRequest(f"Too many questions: {len(job.questions)} (at most "
                             f"{MAX_DECISION_QUESTIONS})")
    for question in job.questions:
        if len(question.labels) > MAX_DECISION_OPTIONS:
            raise InvalidRequest(f"question {question.id!r} has {len(question.labels)} options "
                                 f"(at most {MAX_DECISION_OPTIONS})")
    size = len(job.prefix) + sum(len(q.suffix) + sum(map(len, q.labels)) for q in job.questions)
    if size > MAX_DECISION_TEXT:
        raise InvalidRequest(f"the decision prompt is too long: {size} characters (at most "
                             f"{MAX_DECISION_TEXT})")
