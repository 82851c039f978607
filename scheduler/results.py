"""What a worker sends back: results and the events that carry them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from scheduler.errors import ErrorInfo


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


class GenerationSettings(BaseModel):
    """The parameters a slot actually used (the spec's `generation_settings`), in
    llama-server's order."""

    n_predict: int
    seed: int
    temperature: float
    dynatemp_range: float
    dynatemp_exponent: float
    top_k: int
    top_p: float
    min_p: float
    top_n_sigma: float
    xtc_probability: float
    xtc_threshold: float
    typical_p: float
    repeat_last_n: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: list[str]
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    stop: list[str]
    max_tokens: int
    n_keep: int
    n_discard: int = 0
    ignore_eos: bool
    stream: bool
    n_probs: int = 0
    min_keep: int
    samplers: list[str]
    timings_per_token: bool
    n_ctx: int
    model: str


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
