"""Wire models of llama-server's native endpoints (/completion, /tokenize, /detokenize)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from api.body import drop_nulls
from scheduler.contract import limits
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import (
    CompletionJob,
    DetokenizeJob,
    DraftLimits,
    ExtraContext,
    InfillParts,
    PromptPiece,
    TokenizeJob,
    parse_lora_request,
)
from scheduler.contract.message_delimiters import MessageDelimiter, parse_message_delimiters
from scheduler.contract.sampling import LogitBias, SamplingParams, samplers_from_letters

SAMPLING_FIELDS = tuple(SamplingParams.model_fields)


class PromptObject(DeferredModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt_string: str
    multimodal_data: list[str] | None = None


SinglePrompt = str | list[PromptPiece] | PromptObject


NATIVE_ALIASES: dict[str, tuple[str, ...]] = {
    "n_predict": ("max_completion_tokens", "max_tokens"),
    "n_cmpl": ("n",),
    "n_probs": ("logprobs",),
}
"""llama-server's `add_alias` (server-schema.cpp): a field's other names, read in this order
when the field itself is absent. (`grammar` and `reasoning_budget_end_tag` are aliases there
too, of fields whose handlers read both names; here they are fields of their own.)"""


class CompletionRequest(SamplingParams):
    """POST /completion. Unknown fields are ignored, as llama-server does; known fields must
    have the right type. `null` means the server's default, as in llama-server; llama-server's
    aliases are read (NATIVE_ALIASES). The sampling fields are SamplingParams' (declared once,
    in scheduler/contract/jobs.py)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    native_aliases: ClassVar[bool] = True
    """False for the OpenAI requests, whose fields of those names mean their OpenAI thing."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_and_aliases(cls, data: Any) -> Any:
        data = drop_nulls(data)
        if not (cls.native_aliases and isinstance(data, dict)):
            return data
        for name, aliases in NATIVE_ALIASES.items():
            if name not in data:
                alias = next((a for a in aliases if a in data), None)
                if alias is not None:
                    data[name] = data[alias]
        return data

    prompt: SinglePrompt | list[SinglePrompt]
    stream: bool = False
    n_predict: int | None = Field(default=None, ge=-1)
    stop: list[str] = Field(default_factory=list)
    cache_prompt: bool | None = None
    return_tokens: bool = False
    id_slot: int = -1
    n_keep: int | None = None
    n_discard: int | None = None
    """Tokens dropped by a context shift after the first n_keep (0: half of the rest)."""
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
    sse_ping_interval: Annotated[float | None, AfterValidator(limits.ping_seconds)] = None
    """Seconds between SSE ping comments of this stream (<= 0: none); None: the server's."""
    priority: int | None = None
    """Lower is served first (vLLM's field; ours on llama-server's endpoints); None: the
    tenant's default (docs/fairness.md)."""
    verbose: bool = False
    """OpenAI endpoints: add llama-server's `__verbose` debug object to the response."""
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max")
    speculative_n_min: int | None = Field(default=None, alias="speculative.n_min")
    speculative_p_min: float | None = Field(default=None, alias="speculative.p_min")
    """Per-request speculative decoding limits (the spec's fields: scheduler/contract/jobs.py
    DraftLimits)."""

    message_delimiters: list[MessageDelimiter] = Field(default_factory=list)
    """Texts that start messages in the prompt, `[{role, delimiter}]` (what llama-server's
    chat endpoints pass on from the template): the prefill is cut and checkpointed where user
    messages start. Read as llama-server reads it: entries that are not objects are skipped."""

    @field_validator("message_delimiters", mode="before")
    @classmethod
    def _delimiters(cls, value: Any) -> Any:
        if isinstance(value, list):  # counted before 200,000 entries are read on the loop
            limits.check_count("message_delimiters", len(value), limits.MAX_MESSAGE_DELIMITERS)
        return parse_message_delimiters(value)

    lora: list[Any] | None = None
    """Per-request LoRA scales, `[{id, scale}]`, read as llama-server's parse_lora_request
    (adapters not named at 0, unknown ids ignored); absent or `[]`: the global scales."""

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_is_an_array(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError("'lora' must be an array of objects with 'id' and 'scale' fields")
        return value

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

    def prompt_media(self) -> list[list[str]]:
        """Per prompt (as `prompts`), its multimodal_data: base64 media, one per marker."""
        if isinstance(self.prompt, list) and any(
            isinstance(p, list | PromptObject) for p in self.prompt
        ):
            return [_media(p) for p in self.prompt]
        if isinstance(self.prompt, list) and self.prompt and all(
            isinstance(p, str) for p in self.prompt
        ):
            return [[] for _ in self.prompt]
        return [_media(self.prompt)]

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

    def probs_wanted(self) -> int:
        """How many token probabilities to return (n_probs; the OpenAI bodies read theirs
        from logprobs / top_logprobs as well): set on the job once, capped once by the job
        client (--n-probs-max)."""
        return self.n_probs

    def job(self, model: str, prompt: str | list[PromptPiece]) -> CompletionJob:
        sampling = SamplingParams(**{f: getattr(self, f) for f in SAMPLING_FIELDS})
        return CompletionJob(
            model=model, prompt=prompt, stream=self.stream, n_predict=self.n_predict,
            stop=self.stop, sampling=sampling, cache_prompt=self.cache_prompt,
            return_tokens=self.return_tokens, id_slot=self.id_slot, n_keep=self.n_keep,
            n_discard=self.n_discard,
            n_cache_reuse=self.n_cache_reuse,
            t_max_predict_ms=self.t_max_predict_ms, timings_per_token=self.timings_per_token,
            n_indent=self.n_indent, return_progress=self.return_progress,
            n_probs=self.probs_wanted(),
            post_sampling_probs=self.post_sampling_probs, grammar=self.grammar,
            json_schema=None if self.json_schema is None else json.dumps(self.json_schema),
            logit_bias=self.logit_bias,
            lora=parse_lora_request(self.lora) if self.lora else None,
            draft_limits=self.draft_limits(),
            message_delimiters=self.message_delimiters, priority=self.priority,
        )

    def draft_limits(self) -> DraftLimits | None:
        given = (self.speculative_n_max, self.speculative_n_min, self.speculative_p_min)
        if all(v is None for v in given):
            return None
        n_max, n_min, p_min = given
        if p_min is not None and not 0.0 <= p_min <= 1.0:
            raise InvalidRequest("speculative.p_min must be between 0 and 1 (a probability)")
        return DraftLimits(n_max=n_max, n_min=n_min, p_min=p_min).clamped()


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
    """The prompt's text; its multimodal_data are read by `CompletionRequest.prompt_media`."""
    if isinstance(prompt, PromptObject):
        return prompt.prompt_string
    return prompt


def _media(prompt: Any) -> list[str]:
    return list(prompt.multimodal_data or []) if isinstance(prompt, PromptObject) else []


class TokenizeRequest(DeferredModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return drop_nulls(data)

    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    def to_job(self, model: str) -> TokenizeJob:
        return TokenizeJob(model=model, content=self.content, add_special=self.add_special,
                           parse_special=self.parse_special, with_pieces=self.with_pieces)


class DetokenizeRequest(DeferredModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return drop_nulls(data)

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
