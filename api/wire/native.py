"""Wire models of llama-server's native endpoints (/completion, /tokenize, /detokenize)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler import limits
from scheduler.errors import InvalidRequest, NotSupported
from scheduler.jobs import (
    CompletionJob,
    DetokenizeJob,
    ExtraContext,
    InfillParts,
    LogitBias,
    PromptPiece,
    SamplingParams,
    TokenizeJob,
    samplers_from_letters,
)

SAMPLING_FIELDS = tuple(SamplingParams.model_fields)


class PromptObject(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt_string: str
    multimodal_data: list[str] | None = None


SinglePrompt = str | list[PromptPiece] | PromptObject


class CompletionRequest(BaseModel):
    """POST /completion. Unknown fields are ignored, as llama-server does; known fields must
    have the right type."""

    model_config = ConfigDict(extra="ignore", strict=True)

    prompt: SinglePrompt | list[SinglePrompt]
    stream: bool = False
    n_predict: int | None = Field(default=None, ge=-1)
    stop: list[str] = Field(default_factory=list)
    cache_prompt: bool | None = None
    return_tokens: bool = False
    id_slot: int = -1
    n_keep: int | None = None
    t_max_predict_ms: int = 0
    n_indent: int = Field(default=0, ge=0)
    timings_per_token: bool = False
    return_progress: bool = False
    n_probs: int = Field(default=0, ge=0)
    post_sampling_probs: bool = False
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    logit_bias: list[LogitBias] = Field(default_factory=list)
    response_fields: list[str] = Field(default_factory=list)
    n_cmpl: int = Field(default=1, ge=1)
    n_cache_reuse: int | None = Field(default=None, ge=0)
    verbose: bool = False
    """OpenAI endpoints: add llama-server's `__verbose` debug object to the response."""

    temperature: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    repeat_last_n: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    min_keep: int | None = None
    samplers: list[str] | None = None

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, value: Any) -> Any:
        return parse_logit_bias(value)

    @field_validator("samplers", mode="before")
    @classmethod
    def _samplers_from_chars(cls, value: Any) -> Any:
        """A string is the one-letter form (`--sampling-seq`), e.g. "kypmxt"."""
        if isinstance(value, str):
            return samplers_from_letters(value)
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def prompts(self) -> list[str | list[PromptPiece]]:
        """The prompts, one per completion: a list of strings, token lists, mixed lists or
        objects is several prompts; a flat list of ids and strings is one."""
        if isinstance(self.prompt, list) and any(
            isinstance(p, list | PromptObject) for p in self.prompt
        ):
            return [_plain(p) for p in self.prompt]  # type: ignore[arg-type]
        if isinstance(self.prompt, list) and self.prompt and all(
            isinstance(p, str) for p in self.prompt
        ):
            return list(self.prompt)  # type: ignore[arg-type]
        return [_plain(self.prompt)]  # type: ignore[arg-type]

    def to_jobs(self, model: str) -> list[CompletionJob]:
        """One job per prompt and completion (`n_cmpl`), in the order results are returned."""
        prompts = self.prompts()
        limits.check_fan_out(len(prompts), self.n_cmpl, limits.MAX_PROMPTS)
        jobs: list[CompletionJob] = []
        for prompt in prompts:
            if not prompt:
                raise InvalidRequest("The prompt is empty")
            jobs.extend(self.job(model, prompt) for _ in range(self.n_cmpl))
        return jobs

    def job(self, model: str, prompt: str | list[PromptPiece]) -> CompletionJob:
        sampling = SamplingParams(**{f: getattr(self, f) for f in SAMPLING_FIELDS})
        return CompletionJob(
            model=model, prompt=prompt, stream=self.stream, n_predict=self.n_predict,
            stop=self.stop, sampling=sampling, cache_prompt=self.cache_prompt,
            return_tokens=self.return_tokens, id_slot=self.id_slot, n_keep=self.n_keep,
            n_cache_reuse=self.n_cache_reuse,
            t_max_predict_ms=self.t_max_predict_ms, timings_per_token=self.timings_per_token,
            n_indent=self.n_indent, return_progress=self.return_progress, n_probs=self.n_probs,
            post_sampling_probs=self.post_sampling_probs, grammar=self.grammar,
            json_schema=None if self.json_schema is None else json.dumps(self.json_schema),
            logit_bias=self.logit_bias,
        )


def parse_logit_bias(value: Any) -> Any:
    """llama-server's forms: [[token or string, bias or false], ...] or the OpenAI map
    {"token id or string": bias or false}."""
    if isinstance(value, dict):
        value = [[int(k) if k.lstrip("-").isdigit() else k, v] for k, v in value.items()]
    if not isinstance(value, list):
        return value
    parsed = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2):
            raise ValueError("each logit_bias entry must be [token or string, bias or false]")
        token, bias = item
        if bias is False:
            bias = None
        elif isinstance(bias, bool) or not isinstance(bias, int | float):
            raise ValueError("a logit bias must be a number or false")
        parsed.append({"token": token, "bias": bias})
    return parsed


def _plain(prompt: SinglePrompt) -> str | list[PromptPiece]:
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:
            raise NotSupported("multimodal_data needs a model with a multimodal projector, "
                               "which this server does not have")
        return prompt.prompt_string
    return prompt


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    def to_job(self, model: str) -> TokenizeJob:
        return TokenizeJob(model=model, content=self.content, add_special=self.add_special,
                           parse_special=self.parse_special, with_pieces=self.with_pieces)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    tokens: list[int] = Field(default_factory=list)

    def to_job(self, model: str) -> DetokenizeJob:
        return DetokenizeJob(model=model, tokens=self.tokens)


class InfillRequest(CompletionRequest):
    """POST /infill: every /completion option, plus the code around the gap."""

    prompt: str = ""  # type: ignore[assignment]
    input_prefix: str | list[PromptPiece]
    input_suffix: str | list[PromptPiece]
    input_extra: list[ExtraContext] = Field(default_factory=list)

    def to_jobs(self, model: str) -> list[CompletionJob]:
        infill = InfillParts(input_prefix=self.input_prefix, input_suffix=self.input_suffix,
                             input_extra=self.input_extra)
        limits.check_fan_out(1, self.n_cmpl, limits.MAX_PROMPTS)
        jobs = [self.job(model, self.prompt) for _ in range(self.n_cmpl)]
        for job in jobs:
            job.infill = infill
        return jobs
