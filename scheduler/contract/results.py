"""What a worker sends back: results and the events that carry them."""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import ErrorInfo, ServerError
from scheduler.contract.jobs import LoraScale
from scheduler.contract.sampling import SamplingSettings


class Timings(DeferredModel):
    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    prompt_per_token_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_token_ms: float = 0.0
    predicted_per_second: float = 0.0
    draft_n: int = 0
    draft_n_accepted: int = 0
    """Speculative decoding's drafted and accepted tokens: on the wire only when the run
    drafted any (llama-server's server_slot_stats::to_json)."""

    @model_serializer(mode="wrap")
    def _without_drafts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.draft_n:
            data.pop("draft_n", None)
            data.pop("draft_n_accepted", None)
        return data


class TokenBias(DeferredModel):
    bias: float | None
    """None: -inf, a ban (llama-server's JSON writes -inf as null)."""
    token: int


REPORT_ORDER = (
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
    "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
    "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "mirostat",
    "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "stop", "max_tokens",
    "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "logit_bias", "n_probs",
    "min_keep", "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens",
    "chat_format", "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers",
    "speculative.types", "timings_per_token", "post_sampling_probs", "backend_sampling", "lora",
)
"""llama-server's `generation_settings` of a result, keys and order (server-task.cpp
task_params::to_json)."""
METRICS_ONLY_LEAVES = frozenset({"dry_sequence_breakers", "stop", "logit_bias", "grammar",
                                 "grammar_lazy", "grammar_triggers", "preserved_tokens"})
"""What llama-server's shorter form (`/slots` params, `/props` defaults: to_json(true)) leaves
out."""


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
    lora: list[LoraScale] = Field(default_factory=list)
    """The request's own `lora` list (llama-server's task_params `lora`), not the global scales."""
    grammar: str = ""
    grammar_lazy: bool = False
    grammar_triggers: list[Any] = Field(default_factory=list)
    preserved_tokens: list[int] = Field(default_factory=list)
    chat_format: str = "Content-only"
    reasoning_format: str = "none"
    reasoning_in_content: bool = False
    generation_prompt: str = ""
    speculative_types: str = "none"
    """`speculative.types` on the wire: the worker's --spec-type list (`none` first, as
    llama-server keeps it), `none` in the server's defaults."""
    post_sampling_probs: bool = False
    backend_sampling: bool = False
    n_ctx: int
    model: str
    """Ours (not on the wire): the slot's context and the model's name."""

    def to_wire(self, full: bool = True) -> dict[str, Any]:
        """llama-server's shape: a result's `generation_settings` (`full`), or the shorter
        params of `/slots` and `/props`; its keys only, in its order."""
        data = self.model_dump()
        data["speculative.types"] = data.pop("speculative_types")
        return {key: data[key] for key in REPORT_ORDER
                if key in data and (full or key not in METRICS_ONLY_LEAVES)}


class Candidate(DeferredModel):
    id: int
    token: str
    bytes: list[int]
    p: float


class TokenProbs(DeferredModel):
    """One generated token with its probability and the most probable candidates; rendered
    as logprob/top_logprobs, or prob/top_probs with post_sampling_probs."""

    id: int
    token: str
    bytes: list[int]
    p: float
    top: list[Candidate]


class CompletionResult(DeferredModel):
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


class TokenPiece(DeferredModel):
    id: int
    piece: str | list[int]


class Continuation(DeferredModel):
    """What a completion whose worker died had streamed, read back from its event log
    (scheduler/migration.py): the worker that continues it starts from here."""

    tokens: list[int]
    """Every token generated so far, in order (the continuation prefills prompt + these)."""
    content: str
    """The text its client has (what those tokens made final; a stop string's possible
    beginning is held back still)."""
    probs: list[TokenProbs] = Field(default_factory=list)
    predicted_ms: float = 0.0
    """The generation time its earlier runs reported (timings_per_token), else 0."""
    next_seq: int
    """The seq of the job's next event."""
    migrations: int = 1
    """How many times the job moved (this continuation included)."""
    died_at_ms: int = 0
    """When its last event before the death went out (Redis time, ms; 0: unknown)."""


class TokenizeResult(DeferredModel):
    result_kind: Literal["tokenize"] = "tokenize"
    tokens: list[int] | list[TokenPiece]


class DetokenizeResult(DeferredModel):
    result_kind: Literal["detokenize"] = "detokenize"
    content: str


class SlotActionResult(DeferredModel):
    """What a slot action did: tokens and bytes saved, restored or erased, and how long."""

    result_kind: Literal["slot_action"] = "slot_action"
    action: Literal["save", "restore", "erase"]
    id_slot: int
    filename: str = ""
    n_tokens: int
    n_bytes: int = 0
    ms: float = 0.0


def pack_floats(values: Any) -> str:
    """float32 values (any buffer or sequence of them) as base64 of their little-endian bytes:
    the `encoding_format: base64` of /v1/embeddings, and how vectors cross Redis (exact and a
    third of the size of JSON numbers). A contiguous buffer of float32 (a numpy row) is taken
    as it is, without a float at a time."""
    try:
        view: memoryview | None = memoryview(values)
    except TypeError:
        view = None
    if view is not None and view.format == "f" and view.c_contiguous \
            and sys.byteorder == "little":
        return base64.b64encode(view).decode("ascii")
    packed = array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def unpack_floats(data: str) -> list[float]:
    values = array("f")
    values.frombytes(base64.b64decode(data))
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


class EmbeddingItem(DeferredModel):
    """The embedding of one input of an EmbeddingJob."""

    index: int
    """The input's position in the job's `inputs`."""
    n_tokens: int
    """Tokens the input was (`tokens_evaluated`, `usage`)."""
    n_embd: int = 0
    data: str = ""
    """Rows of `n_embd` float32 values, packed (pack_floats): one row when the worker pools,
    one per token with pooling none."""
    error: ErrorInfo | None = None
    """Set (and `data` empty) when this input failed in a job with per_input_errors."""

    def rows(self) -> list[list[float]]:
        values = unpack_floats(self.data)
        width = self.n_embd or len(values) or 1
        return [values[i:i + width] for i in range(0, len(values), width)]

    def vector(self) -> list[float]:
        """The pooled embedding (the first row)."""
        return unpack_floats(self.data)[:self.n_embd]


class EmbeddingResult(DeferredModel):
    result_kind: Literal["embedding"] = "embedding"
    pooling: Literal["none", "mean", "cls", "last", "rank"]
    """The worker's pooling: with "none" each item holds one row per token, unnormalized."""
    items: list[EmbeddingItem]
    """One per input, in input order."""

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)


class RerankItem(DeferredModel):
    """The score of one document of a RerankJob."""

    index: int
    """The document's position in the job's `documents`."""
    score: float
    n_tokens: int
    """Tokens of the (query, document) sequence."""
    error: ErrorInfo | None = None
    """Set (score meaningless) when this document failed in a job with per_input_errors."""


class RerankResult(DeferredModel):
    result_kind: Literal["rerank"] = "rerank"
    items: list[RerankItem]
    """One per document, in document order (not sorted)."""

    @property
    def n_tokens(self) -> int:
        return sum(item.n_tokens for item in self.items)


class DecisionAnswer(DeferredModel):
    id: str
    probabilities: list[float]
    """Of each label of the question, in its order (restricted softmax, sum 1)."""
    n_prompt_tokens: int
    """The question's prompt: the shared prefix plus its own suffix."""


class DecisionResult(DeferredModel):
    """The answers of a decision job, and what the worker decoded for them."""

    result_kind: Literal["decision"] = "decision"
    worker_id: str
    model: str
    answers: list[DecisionAnswer]
    n_prefix_tokens: int
    prefix_cached: int
    """Prefix tokens reused from the slot's cache (not decoded again)."""
    tokens_decoded: int
    """Every token this job decoded: its prefix (once), the questions' suffixes and the
    candidate labels' tokens."""
    temperatures: dict[str, float] = Field(default_factory=dict)
    """The temperatures applied, by question type (from the model file; 1 when none)."""


Result = Annotated[
    CompletionResult | TokenizeResult | DetokenizeResult | SlotActionResult | EmbeddingResult
    | RerankResult | DecisionResult,
    Field(discriminator="result_kind"),
]
# built on first use, as the models are (scheduler/contract/deferred.py)
RESULT: TypeAdapter[Result] = TypeAdapter(Result, config=ConfigDict(defer_build=True))


AnyResult = TypeVar("AnyResult", CompletionResult, TokenizeResult, DetokenizeResult,
                     SlotActionResult, EmbeddingResult, RerankResult, DecisionResult)


def expect_result(result: Result, kind: type[AnyResult]) -> AnyResult:
    """`result` as the kind its job asked for (a worker that answers with another kind is a
    bug: 500, not an assert)."""
    if not isinstance(result, kind):
        raise ServerError(f"a worker answered with a {type(result).__name__}, not a "
                          f"{kind.__name__}")
    return result


class PromptProgress(DeferredModel):
    total: int
    cache: int
    processed: int
    time_ms: int
    """Whole milliseconds, as llama-server's (an integer in its JSON)."""


class TokenEvent(DeferredModel):
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
    post_sampling_probs: bool = False
    """The job's post_sampling_probs: `probs` are probabilities after sampling (rendered as
    prob/top_probs), not logprobs. A renderer needs nothing but the event."""


class FinalEvent(DeferredModel):
    kind: Literal["final"] = "final"
    result: Result


class StoredFinalEvent(DeferredModel):
    """A final event whose result's JSON is over keys.RESULT_INLINE_MAX_BYTES: the result is in
    the object store at `key` (storage/results.py). The api reads it and hands on the
    FinalEvent (scheduler/job_events.py); nothing past that sees this kind."""

    kind: Literal["stored_final"] = "stored_final"
    key: str
    size: int


class StartedEvent(DeferredModel):
    """A slot took the job: from here a stream's headers go out (and its pings)."""

    kind: Literal["started"] = "started"


class ErrorEvent(DeferredModel):
    kind: Literal["error"] = "error"
    error: ErrorInfo


Event = Annotated[TokenEvent | FinalEvent | StoredFinalEvent | ErrorEvent | StartedEvent,
                  Field(discriminator="kind")]


class EventEnvelope(DeferredModel):
    """One message on a job's channel; `seq` counts from 0 per job so gaps are detectable."""

    job_id: str
    seq: int
    event: Event


ENVELOPE = TypeAdapter(EventEnvelope)
