"""Wire models of llama-server's native endpoints (/completion, /tokenize, /detokenize)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.errors import InvalidRequest, NotSupported
from scheduler.jobs import CompletionJob, DetokenizeJob, PromptPiece, SamplingParams, TokenizeJob

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
    timings_per_token: bool = False

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
        sampling = SamplingParams(**{f: getattr(self, f) for f in SAMPLING_FIELDS})
        jobs = []
        for prompt in self.prompts():
            if not prompt:
                raise InvalidRequest("The prompt is empty")
            jobs.append(CompletionJob(
                model=model, prompt=prompt, stream=self.stream, n_predict=self.n_predict,
                stop=self.stop, sampling=sampling, cache_prompt=self.cache_prompt,
                return_tokens=self.return_tokens, id_slot=self.id_slot, n_keep=self.n_keep,
                t_max_predict_ms=self.t_max_predict_ms, timings_per_token=self.timings_per_token,
            ))
        return jobs


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
