"""The bodies of /embedding, /embeddings, /v1/embeddings and /rerank (and its aliases), read as
llama-server reads them (server-context.cpp handle_embeddings_impl and post_rerank,
server-common.cpp tokenize_input_prompts), into jobs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    StrictInt,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from api.media.embeddings import PendingMedia, content_media, has_media, prompt_media
from scheduler.contract import limits
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest, ServerError
from scheduler.contract.jobs import EmbeddingInput, EmbeddingJob, RerankJob

REFUSED_FIELDS = {"dimensions": "\"dimensions\" is not supported: the model's embeddings have "
                                "one size"}
ELEMENT_SHAPES = ("\"prompt\" elements must be a string, a list of tokens, a JSON object "
                  "containing a prompt string, or a list of mixed strings & tokens.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _element(value: Any) -> EmbeddingInput | PendingMedia:
    """One input: a string, token ids, token ids mixed with strings, {"prompt_string": …}
    (with its "multimodal_data"), or OpenAI's {"content": [{"type": "text", "text": …},
    {"type": "image_url", …}, …]}. Media are read later (api/media/embeddings.py), once the
    model's projector is known."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) or _is_int(v) for v in value):
        return list(value)
    if isinstance(value, dict):
        if "content" in value:
            if not isinstance(value["content"], list):
                raise InvalidRequest("\"content\" must be an array")
            return content_media(value["content"])
        if "prompt_string" in value:
            if "multimodal_data" in value:
                return prompt_media(value)
            inner = _element(value["prompt_string"])
            if isinstance(inner, PendingMedia):  # llama-server tokenizes it as mixed text
                raise InvalidRequest(ELEMENT_SHAPES)
            return inner
    raise InvalidRequest(ELEMENT_SHAPES)


def read_inputs(prompt: Any) -> list[EmbeddingInput | PendingMedia]:
    """An array with no integer in it holds one input per element; anything else is one
    input."""
    if isinstance(prompt, list) and not any(_is_int(v) for v in prompt):
        return [_element(p) for p in prompt]
    return [_element(prompt)]


def _read_body(body: dict[str, Any]) -> list[EmbeddingInput | PendingMedia]:
    """The inputs of an embeddings body, read and checked as llama-server reads it (its
    messages)."""
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) is not None:
            raise InvalidRequest(why)
    if "input" in body:
        prompt = body["input"]
    elif "content" in body:
        prompt = body["content"]
    else:
        raise InvalidRequest("\"input\" or \"content\" must be provided")
    if "encoding_format" in body and body["encoding_format"] not in ("float", "base64"):
        raise InvalidRequest("The format to return the embeddings in. Can be either float "
                             "or base64")
    inputs = read_inputs(prompt)
    if not inputs:
        raise InvalidRequest("\"input\" must not be empty")
    _check_count(len(inputs), "inputs")
    normalize = body.get("embd_normalize")
    if normalize is not None and not _is_int(normalize):
        raise InvalidRequest("\"embd_normalize\" must be an integer")
    return inputs


class ContentPart(DeferredModel):
    """A part of OpenAI's `content` array: `{"type": "text", "text": …}`, or with a
    multimodal projector `{"type": "image_url", "image_url": {"url": …}}`, `{"type":
    "input_audio", "input_audio": {"data": …}}` (`input_video` / `video_url`: refused, video is
    not built)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "image_url", "input_audio", "input_video", "video_url"]
    text: Any = ""
    """A string (anything else reads as no text)."""
    image_url: Any = None
    input_audio: Any = None


class ContentInput(DeferredModel):
    """OpenAI's `{"content": [...]}`: its texts joined, each media part where it stands."""

    model_config = ConfigDict(extra="allow")

    content: list[ContentPart]


class PromptInput(DeferredModel):
    """llama-server's `{"prompt_string": ..., "multimodal_data": ["<base64>", ...]}` (one
    media marker of /props in the prompt for each item; a model without a projector: 500)."""

    model_config = ConfigDict(extra="allow")

    prompt_string: Any = Field(description="a string, token ids, or strings and token ids (a "
                                           "string with multimodal_data)")
    multimodal_data: Any = Field(None, description="base64 images or audio, one per media "
                                                   "marker of prompt_string")


EmbeddingElement = str | list[StrictInt | str] | ContentInput | PromptInput
"""One input: a string, token ids (mixed with strings), or one of the objects."""
EmbeddingPrompt = Annotated[
    EmbeddingElement | list[EmbeddingElement],
    Field(description="one input, or an array of inputs (an array with an integer in it is "
                      "one input of token ids)")]


class EmbeddingsRequest(DeferredModel):
    """The body of /embedding, /embeddings and /v1/embeddings, read once, as llama-server
    reads it (its checks, its messages: `_read_body`). The fields are the body as sent, which
    /openapi.json describes; `inputs` are what the reading made of `input` (or `content`)."""

    model_config = ConfigDict(extra="allow")

    input: EmbeddingPrompt | None = None
    content: EmbeddingPrompt | None = Field(
        None, description="llama-server's own name for the input: answered natively")
    encoding_format: Literal["float", "base64"] | None = None
    embd_normalize: StrictInt | None = Field(
        None, description="-1: none, 0: max absolute int16, 1: taxicab, 2: euclidean (the "
                          "default), >2: p-norm")
    model: Any = None
    dimensions: None = Field(None, description="not supported: the model's embeddings have "
                                               "one size")
    _inputs: list[EmbeddingInput | PendingMedia] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _as_llama_server_reads_it(cls, data: Any, handler: ModelWrapValidatorHandler[Any]
                                  ) -> Any:
        """The body's reading is llama-server's (it raises InvalidRequest as it does); the
        fields keep the body's values as they passed it, not validated a second time."""
        if not isinstance(data, dict):
            return handler(data)
        inputs = _read_body(data)
        request = cls.model_construct(**{k: v for k, v in data.items() if k in cls.model_fields})
        request._inputs = inputs
        return request

    @property
    def inputs(self) -> list[EmbeddingInput | PendingMedia]:
        """The inputs; those with media are read into the job by `api/media/embeddings.py`."""
        return self._inputs

    @property
    def base64(self) -> bool:
        return self.encoding_format == "base64"

    def answers_oai(self, oai_route: bool) -> bool:
        """OpenAI's answer: /v1/embeddings (`oai_route`) with `input`; `content` always
        answers natively."""
        return oai_route and "input" in self.model_fields_set

    def to_job(self, model_id: str, inputs: list[EmbeddingInput] | None = None
               ) -> EmbeddingJob:
        """The job; `inputs`: the inputs with their media read (needed when some have media)."""
        if inputs is None:
            if has_media(self.inputs):
                raise ServerError("an embedding input's media were not read")
            inputs = [i for i in self.inputs if not isinstance(i, PendingMedia)]
        return EmbeddingJob(model=model_id, inputs=inputs, embd_normalize=self.embd_normalize)


def _check_count(count: int, what: str) -> None:
    if count > limits.MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(f"Too many {what}: {count} (at most {limits.MAX_EMBEDDING_INPUTS} "
                             "per request; use the Batch API for more)")


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _read_rerank(body: dict[str, Any]) -> dict[str, Any]:
    """A rerank body checked and read as llama-server reads it (its messages): the documents
    (`documents`, else TEI's `texts`), `top_n` (a wrong type reads as the default, as its
    json_value does), whether the answer is TEI's shape."""
    if "query" not in body:
        raise InvalidRequest("\"query\" must be provided")
    query = body["query"]
    if not isinstance(query, str):
        raise InvalidRequest("\"query\" must be a string")
    documents = _strings(body.get("documents"))
    if documents is None:
        documents = _strings(body.get("texts")) or []
    if not documents:
        raise InvalidRequest("\"documents\" must be a non-empty string array")
    _check_count(len(documents), "documents")
    top_n = body.get("top_n", len(documents))
    if not _is_int(top_n):
        top_n = len(documents)
    if top_n < 0:
        raise InvalidRequest("\"top_n\" must not be negative")
    tei = "texts" in body
    return {**body, "query": query, "documents": documents, "texts": _strings(body.get("texts")),
            "top_n": top_n, "tei": tei, "return_text": tei and body.get("return_text") is True}


def _no_default(schema: dict[str, Any]) -> None:
    """A field whose default the reading sets: /openapi.json shows none."""
    schema.pop("default", None)


class RerankRequest(DeferredModel):
    """The body of /rerank (and /reranking, /v1/rerank, /v1/reranking): Jina's shape, or TEI's
    (`texts` for the documents: the answer is a bare array of {index, score[, text]}). Read as
    llama-server reads it (`_read_rerank`: its checks, its messages)."""

    model_config = ConfigDict(extra="allow")

    query: str
    documents: list[str] = Field(default_factory=list,
                                 description="the documents to rank (else `texts`)")
    texts: list[str] | None = Field(None, description="TEI's name for the documents: the "
                                                      "answer is TEI's shape")
    top_n: int = Field(0, description="how many of the best to answer (default: all)",
                       json_schema_extra=_no_default)
    return_text: bool = Field(False, description="TEI's shape: each answer with its text")
    model: Any = None
    tei: SkipJsonSchema[bool] = False
    """`texts` was sent (whatever its value): TEI's shape."""

    @model_validator(mode="before")
    @classmethod
    def _as_llama_server_reads_it(cls, data: Any) -> Any:
        return _read_rerank(data) if isinstance(data, dict) else data

    def to_job(self, model_id: str) -> RerankJob:
        return RerankJob(model=model_id, query=self.query, documents=self.documents)
