"""The job contract between api and worker: what a worker is asked to do, as pydantic models.

Fields left `None` take the worker's server-wide default (its flags), so the api never needs to
know them; the worker reports the values it used in `generation_settings`. Sampling (the
settings, a request's overrides, logit bias) is scheduler/contract/sampling.py's; this module
re-exports its names, so a job's field types are all importable from here."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.media import MediaRef
from scheduler.contract.message_delimiters import MessageDelimiter
from scheduler.contract.sampling import (
    DEFAULT_DRY_BREAKERS,
    DEFAULT_SAMPLERS,
    DEFAULT_SEED,
    SAMPLER_LETTERS,
    LogitBias,
    SamplingParams,
    SamplingSettings,
    samplers_from_letters,
)

__all__ = [  # this module's names, and those of sampling.py (and MessageDelimiter) it re-exports
    "DEFAULT_DRY_BREAKERS", "DEFAULT_SAMPLERS", "DEFAULT_SEED", "JOB", "SAMPLER_LETTERS",
    "CompletionJob", "DecisionJob", "DecisionQuestion", "DetokenizeJob", "DraftLimits",
    "EmbeddingInput", "EmbeddingJob", "ExtraContext", "InfillParts", "Job", "JobKind",
    "LogitBias", "LoraScale", "MediaPromptInput", "MessageDelimiter", "PromptPiece",
    "ReasoningSpec", "RerankJob", "SamplingParams", "SamplingSettings", "SlotActionJob",
    "SystemOneInput", "SystemOneOption", "SystemOneQuestion", "TokenizeJob", "new_job_id",
    "parse_job", "parse_lora_request", "samplers_from_letters",
    "scales_of",
]

PromptPiece = int | str
"""A prompt is a string, or a list of token ids and strings (tokenized by the worker)."""


class JobKind(StrEnum):
    """What a job asks; also the name of the arq function that runs it."""

    COMPLETION = "completion"
    TOKENIZE = "tokenize"
    DETOKENIZE = "detokenize"
    SLOT_ACTION = "slot_action"
    EMBEDDING = "embedding"
    RERANK = "rerank"
    DECISION = "decision"


def new_job_id() -> str:
    return uuid.uuid4().hex


class LoraScale(DeferredModel):
    """One adapter's scale, by its id (its place in the worker's --lora list)."""

    id: int
    scale: float


def parse_lora_request(entries: list[Any]) -> list[LoraScale]:
    """llama-server's parse_lora_request: each entry's `id` (default -1) and `scale` (default
    0.0), a value of the wrong type read as its default; a later entry for an id wins."""
    scales: dict[int, float] = {}
    for entry in entries:
        item = entry if isinstance(entry, dict) else {}
        raw_id, raw_scale = item.get("id", -1), item.get("scale", 0.0)
        lora_id = raw_id if isinstance(raw_id, int) and not isinstance(raw_id, bool) else -1
        try:
            scale = (float(raw_scale) if isinstance(raw_scale, int | float)
                     and not isinstance(raw_scale, bool) else 0.0)
        except OverflowError:  # an integer no double holds
            raise InvalidRequest(f"LoRA scale {str(raw_scale)[:20]}... is out of range") from None
        scales[lora_id] = scale
    return [LoraScale(id=i, scale=v) for i, v in sorted(scales.items())]


def scales_of(n_adapters: int, given: list[LoraScale]) -> list[float]:
    """construct_lora_list: every adapter's scale, 0 for those not named (an unknown id is
    ignored)."""
    by_id = {entry.id: entry.scale for entry in given}
    return [by_id.get(i, 0.0) for i in range(n_adapters)]


class ExtraContext(DeferredModel):
    text: str
    filename: str = "tmp"


class InfillParts(DeferredModel):
    """/infill: the prompt goes between prefix and suffix, in the model's FIM format."""

    input_prefix: str | list[PromptPiece]
    input_suffix: str | list[PromptPiece]
    input_extra: list[ExtraContext] = Field(default_factory=list)


class ReasoningSpec(DeferredModel):
    """The thinking block of a chat completion, for the reasoning budget and early end."""

    start: str = "<think>"
    end: str = "</think>"
    budget: int = -1
    """Tokens the block may take; -1 unlimited, 0 ends it at once."""
    message: str = ""
    """Injected before the end tag when the block is cut short."""
    open_at_start: bool = False
    """The prompt ends inside the block (the template opened it)."""


class DraftLimits(DeferredModel):
    """A request's `speculative.n_max`, `speculative.n_min`, `speculative.p_min` (the spec's
    fields; compiled out of the vendored llama-server, honoured by llamaq): the longest draft,
    the shortest one worth verifying, and the least probability of a draft model's token
    (draft-simple; the n-gram modes' drafts have none, as in llama.cpp). Clamped as
    llama-server clamped them: 0 <= n_min <= n_max."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None

    def clamped(self) -> DraftLimits:
        n_max = None if self.n_max is None else max(self.n_max, 0)
        n_min = self.n_min
        if n_min is not None:
            n_min = max(min(n_min, n_max) if n_max is not None else n_min, 0)
        return DraftLimits(n_max=n_max, n_min=n_min, p_min=self.p_min)


class CompletionJob(DeferredModel):
    kind: Literal[JobKind.COMPLETION] = JobKind.COMPLETION
    job_id: str = Field(default_factory=new_job_id)
    model: str
    prompt: list[PromptPiece] | str
    stream: bool = False
    n_predict: int | None = None
    stop: list[str] = Field(default_factory=list)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    cache_prompt: bool | None = None
    return_tokens: bool = False
    id_slot: int = -1
    worker_id: str | None = None
    """Set with id_slot: the worker that holds that slot (id_slot is then worker-local)."""
    n_keep: int | None = None
    n_discard: int | None = None
    n_cache_reuse: int | None = None
    t_max_predict_ms: int = 0
    n_indent: int = 0
    timings_per_token: bool = False
    return_progress: bool = False
    n_probs: int = 0
    post_sampling_probs: bool = False
    grammar: str | None = None
    """GBNF text; `json_schema` (JSON text of a schema) is converted to GBNF by the worker."""
    json_schema: str | None = None
    json_schema_frame: list[str] | None = None
    """[prefix, suffix, separator, *named]: the output is `json_schema`'s value between prefix
    and suffix (a forced tool call in the template's own format: `<tool_call>\n` … `\n
    </tool_call>`), repeated after a non-empty separator. With `named`, `json_schema` is an
    `anyOf` of one schema a function, the i-th written after prefix and named[i] (the name in
    the template's markers: worker/engine/framed_grammar.py); one with the key
    `x-llamaq-tagged-arguments` ([key prefix, between key and value, value's closing marker])
    has its arguments written as tagged pairs (worker/engine/tagged_grammar.py)."""
    logit_bias: list[LogitBias] = Field(default_factory=list)
    infill: InfillParts | None = None
    reasoning: ReasoningSpec | None = None
    chat_format: str = "Content-only"
    reasoning_format: str = "none"
    """A chat's parser as llama-server names it in generation_settings (api/chat/prepare.py)."""
    preserved_tokens: list[str] = Field(default_factory=list)
    """Texts of special tokens the worker writes as text even without --special (llama-server's
    `preserved_tokens`: what marks reasoning or tool calls for the chat parser); a text that is
    not one token of the model's vocabulary is ignored."""
    lora: list[LoraScale] | None = None
    """The request's LoRA scales by adapter id (those not named at 0); None: the worker's
    global scales when the run starts (a request without `lora`, or with `[]`)."""
    draft_limits: DraftLimits | None = None
    """The request's speculative.* fields (None: the worker's --spec-* flags alone)."""
    background: bool = False
    """A batch line: while an online request's prompt is evaluated it sits the step out, and
    its own prompt goes in small parts (worker/engine/step_plan.py), so online requests keep
    priority."""
    migration_limit: int = 0
    """How many times the job may continue on another worker after its worker died
    (--migration-limit, set by the api; 0: a job that sent something ends with 503)."""
    media: list[MediaRef] = Field(default_factory=list)
    """Images and audio, one per `media_marker` in the prompt (a string), in order."""
    media_marker: str = ""
    """The marker the prompt's text holds where each media item goes."""
    message_delimiters: list[MessageDelimiter] = Field(default_factory=list)
    """Where the prompt's messages start (a chat's, from its template; /completion's own)."""
    tenant: str | None = None
    """Under --tenants, the tenant whose request it is (set by the api's job client): /slots
    shows a slot's `params` to that tenant (and the admin) only."""
    cache_salt: str | None = None
    """Under --tenants, the cache group of its tenant (the tenant and those it shares caches
    with, api/tenants/config.py `share_cache_with`): a slot's KV, the host prompt cache, the
    fleet KV tier and prefix routing serve it only what was made under the same salt (vLLM's
    `cache_salt`). None (no --tenants): one group, as llama-server."""
    learn_lookup: bool = True
    """Whether -lcd's lookup cache (shared by every tenant's drafts) may learn its tokens:
    under --tenants only for a tenant whose `share_lookup_cache` allows it."""
    event_log_max_bytes: int = 0
    """Bytes of events the job's log keeps: its share of its request's budget (set by the api,
    scheduler/contract/limits.py budget_request); 0: keys.EVENT_LOG_MAX_BYTES."""
    reply_to: str = ""
    """The pub/sub channel of the api pod that queued the job (scheduler/hub.py
    EventHub.channel, set by its job client): the worker announces the job's events there, one
    message a flush for all that pod's jobs (issue 44); "": on the job's own channel."""
    priority: int | None = None
    """The request's `priority` (vLLM's field, ours on llama-server's endpoints): lower is
    served first, in the queues and in a worker's admission (docs/fairness.md). None: its
    tenant's `default_priority` (the api's job client sets it before the job is queued; a
    worker reads None as 0)."""
    weight: float = 1.0
    """Its tenant's `weight` in the fair share of the model (scheduler/fair_share.py; set by
    the api's job client)."""


class TokenizeJob(DeferredModel):
    kind: Literal[JobKind.TOKENIZE] = JobKind.TOKENIZE
    job_id: str = Field(default_factory=new_job_id)
    model: str
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeJob(DeferredModel):
    kind: Literal[JobKind.DETOKENIZE] = JobKind.DETOKENIZE
    job_id: str = Field(default_factory=new_job_id)
    model: str
    tokens: list[int]


class SlotActionJob(DeferredModel):
    """POST /slots/{id}?action=save|restore|erase, on the worker that holds the slot."""

    kind: Literal[JobKind.SLOT_ACTION] = JobKind.SLOT_ACTION
    job_id: str = Field(default_factory=new_job_id)
    model: str
    worker_id: str
    id_slot: int
    """The worker-local slot id."""
    action: Literal["save", "restore", "erase"]
    filename: str = ""
    tenant_file: bool = False
    """Under --tenants the file is the caller's own (api/tenants): a restore that finds none
    is 404, as another tenant's file is (ids leak nothing), not llama-server's 400."""
    cache_salt: str | None = None
    """The caller's cache group (CompletionJob.cache_salt): a restored slot serves it."""


class MediaPromptInput(DeferredModel):
    """An embedding input with media (llama-server's `{"prompt_string", "multimodal_data"}`, or
    an OpenAI `content` array with image or audio parts): `prompt` holds `marker` where each
    item of `media` goes, in order. The worker's projector reads the media
    (worker/runtime/media.py)."""

    prompt: str
    media: list[MediaRef] = Field(min_length=1)
    marker: str
    """The model's media marker (/props media_marker: every worker of the model agrees)."""


EmbeddingInput = str | list[PromptPiece] | MediaPromptInput
"""One input of an embedding job: a string, token ids, or token ids mixed with strings (as a
prompt of /completion: the first string gets the model's special tokens), or a prompt with
media."""


class EmbeddingJob(DeferredModel):
    """Embed many inputs (`/embedding`, `/embeddings`, `/v1/embeddings`, a chunk of a batch).

    Runs on a worker started with `--embedding` (queue: scheduler/contract/kinds.py queue_for). The
    worker decodes the inputs of this job, and of every other embedding job it holds, together
    as separate sequences. The result (scheduler/contract/results.py EmbeddingResult) has one
    item per input, in the order of `inputs`: one row when the worker pools (`--pooling` other than
    none), one row per token when it does not."""

    kind: Literal[JobKind.EMBEDDING] = JobKind.EMBEDDING
    job_id: str = Field(default_factory=new_job_id)
    model: str
    inputs: list[EmbeddingInput] = Field(min_length=1)
    embd_normalize: int | None = None
    """-1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, >2 p-norm; None: the
    worker's --embd-normalize. Pooled embeddings only (token rows are never normalized)."""
    per_input_errors: bool = False
    """False (online requests): the first input that fails fails the job with that error, as
    llama-server answers. True (batch chunks): a failed input gets its error in its item and
    the other inputs still get their embeddings."""
    background: bool = False
    """A batch chunk: it waits in the model's background queue and its inputs fill a decode
    only after every waiting online input."""


class RerankJob(DeferredModel):
    """Score `documents` against `query` (`/rerank` and its aliases, a chunk of a batch).

    Runs on a worker started with `--rerank`; each (query, document) pair is one sequence,
    formatted as llama-server's format_prompt_rerank does (the model's "rerank" template, else
    BOS query EOS SEP document EOS as the vocabulary asks). The result (RerankResult) has one
    item per document, in the order of `documents`; sorting and `top_n` are the api's."""

    kind: Literal[JobKind.RERANK] = JobKind.RERANK
    job_id: str = Field(default_factory=new_job_id)
    model: str
    query: str
    documents: list[str] = Field(min_length=1)
    per_input_errors: bool = False
    """As EmbeddingJob.per_input_errors."""
    background: bool = False
    """As EmbeddingJob.background."""



class DecisionQuestion(DeferredModel):
    """One question of a decision job, rendered by the api: the text that follows the shared
    prefix, and the candidate labels whose continuation probabilities answer it."""

    id: str
    type: Literal["choice", "score", "noul"]
    suffix: str
    labels: list[str] = Field(min_length=1)
    """The text of each candidate answer, in the order the answer reports them."""


class SystemOneOption(DeferredModel):
    key: str
    description: Any = None


class SystemOneQuestion(DeferredModel):
    """A question as a decision family's systemone template reads it: its options are the
    choice's criteria in their order, the score's levels ("0" … "K-1", with their
    descriptions), or noul's "false" and "true" (with their descriptions, or null)."""

    id: str
    type: Literal["choice", "score", "noul"]
    instructions: Any
    options: list[SystemOneOption]


class SystemOneInput(DeferredModel):
    """The request as a decision family of the spec reads it (llama.cpp's server-decision.cpp):
    the state without its media parts, and the questions."""

    state: Any
    questions: list[SystemOneQuestion]


class DecisionJob(DeferredModel):
    """POST /v1/systemone: the state's prompt (`prefix`, prefilled once) and the questions,
    each read from the logits over its labels; nothing is sampled (worker/decisions/run.py).
    `systemone`: the request itself, for a model of a label-logit family, whose worker renders
    it with the model's own systemone template and label codes
    (worker/decisions/systemone_prompt.py) instead of llamaq's prompt."""

    kind: Literal[JobKind.DECISION] = JobKind.DECISION
    job_id: str = Field(default_factory=new_job_id)
    model: str
    prefix: str
    questions: list[DecisionQuestion] = Field(min_length=1)
    systemone: SystemOneInput | None = None
    worker_id: str | None = None
    media: list[MediaRef] = Field(default_factory=list)
    """Images (or audio), one per `media_marker` in `prefix`, in order (a prompted decision on a
    worker with a multimodal projector)."""
    media_marker: str = ""
    cache_salt: str | None = None
    """As CompletionJob.cache_salt: its prefix reuses (and leaves) only its tenant group's KV."""


Job = Annotated[CompletionJob | TokenizeJob | DetokenizeJob | SlotActionJob | EmbeddingJob
                | RerankJob | DecisionJob, Field(discriminator="kind")]
# built on first use, as the models are (scheduler/contract/deferred.py)
JOB: TypeAdapter[Job] = TypeAdapter(Job, config=ConfigDict(defer_build=True))


def parse_job(payload: Any, kind: JobKind) -> Job:
    """A job as the worker's arq function `kind` received it: validated by the union, of the
    kind that function runs. Raises InvalidRequest otherwise (an unknown kind included)."""
    try:
        job = JOB.validate_python(payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"malformed {kind} job: {where}: {first['msg']}") from None
    if job.kind is not kind:
        raise InvalidRequest(f"a {job.kind} job reached the {kind} function")
    return job
