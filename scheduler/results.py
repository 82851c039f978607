"""What a worker sends back: results and the events that carry them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from scheduler.errors import ErrorInfo, ServerError
from scheduler.jobs import SamplingSettings


class Timings(BaseModel):
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_token_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_token_ms: float = 0.0
    predicted_per_second: float = 0.0


class TokenBias(BaseModel):
    bias: float | None
    """None: -inf, a ban (llama-server's JSON writes -inf as null)."""
    token: int


REPORT_ORDER = (
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
    "mirostat_tau", "mirostat_eta", "stop", "max_tokens", "n_predict", "n_keep", "n_discard",
    "ignore_eos", "stream", "logit_bias", "n_probs", "min_keep", "samplers",
    "timings_per_token", "n_ctx", "model",
)
"""llama-server's order of generation_settings (server-task.cpp task_params::to_json)."""


class GenerationSettings(SamplingSettings):
    """The parameters a slot actually used (the spec's `generation_settings`): the resolved
    sampling settings, dumped as they are, and the other per-request settings."""

    n_predict: int
    stop: list[str]
    max_tokens: int
    n_keep: int
    n_discard: int = 0
    stream: bool
    logit_bias: list[TokenBias] = Field(default_factory=list)
    n_probs: int = 0
    timings_per_token: bool
    n_ctx: int
    model: str

    @model_serializer(mode="wrap")
    def _in_report_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        ordered = {name: data[name] for name in REPORT_ORDER if name in data}
        return {**ordered, **data}


class Candidate(BaseModel):
    id: int
    token: str
    bytes: list[int]
    p: float


class TokenProbs(BaseModel):
    """One generated token with its probability and the most probable candidates; rendered
    as logprob/top_logprobs, or prob/top_probs with post_sampling_probs."""

    id: int
    token: str
    bytes: list[int]
    p: float
    top: list[Candidate]


class CompletionResult(BaseModel):
    result_kind: Literal["completion"] = "completion"
    index: int = 0
    worker_id: str
    content: str
    tokens: list[int]
    id_slot: int
    model: str
    prompt: str
    stop_type: Literal["none", "eos", "limit", "word"]
    stopping_word: str
    truncated: bool
    has_new_line: bool
    tokens_predicted: int
    tokens_evaluated: int
    tokens_cached: int
    generation_settings: GenerationSettings
    timings: Timings
    probs: list[TokenProbs] = Field(default_factory=list)
    post_sampling_probs: bool = False


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]


class TokenizeResult(BaseModel):
    result_kind: Literal["tokenize"] = "tokenize"
    tokens: list[int] | list[TokenPiece]


class DetokenizeResult(BaseModel):
    result_kind: Literal["detokenize"] = "detokenize"
    content: str


class SlotActionResult(BaseModel):
    """What a slot action did: tokens and bytes saved, restored or erased, and how long."""

    result_kind: Literal["slot_action"] = "slot_action"
    action: Literal["save", "restore", "erase"]
    id_slot: int
    filename: str = ""
    n_tokens: int
    n_bytes: int = 0
    ms: float = 0.0


Result = Annotated[
    CompletionResult | TokenizeResult | DetokenizeResult | SlotActionResult,
    Field(discriminator="result_kind"),
]


AnyResult = TypeVar("AnyResult", CompletionResult, TokenizeResult, DetokenizeResult,
                     SlotActionResult)


def expect_result(result: Result, kind: type[AnyResult]) -> AnyResult:
    """`result` as the kind its job asked for (a worker that answers with another kind is a
    bug: 500, not an assert)."""
    if not isinstance(result, kind):
        raise ServerError(f"a worker answered with a {type(result).__name__}, not a "
                          f"{kind.__name__}")
    return result


class PromptProgress(BaseModel):
    total: int
    cache: int
    processed: int
    time_ms: float


class TokenEvent(BaseModel):
    """Text that became final during one decode step (may be empty while a stop word is open)."""

    kind: Literal["token"] = "token"
    content: str
    tokens: list[int]
    timings: Timings | None = None
    probs: list[TokenProbs] = Field(default_factory=list)
    progress: PromptProgress | None = None
    n_decoded: int = 0
    """Tokens generated so far (the `tokens_predicted` of a native partial result)."""
    n_prompt_tokens: int = 0


class FinalEvent(BaseModel):
    kind: Literal["final"] = "final"
    result: Result


class StartedEvent(BaseModel):
    """A slot took the job: from here a stream's headers go out (and its pings)."""

    kind: Literal["started"] = "started"


class ErrorEvent(BaseModel):
    kind: Literal["error"] = "error"
    error: ErrorInfo


Event = Annotated[TokenEvent | FinalEvent | ErrorEvent | StartedEvent,
                  Field(discriminator="kind")]


class EventEnvelope(BaseModel):
    """One message on a job's channel; `seq` counts from 0 per job so gaps are detectable."""

    job_id: str
    seq: int
    event: Event


ENVELOPE = TypeAdapter(EventEnvelope)
