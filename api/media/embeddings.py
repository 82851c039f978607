"""Embedding inputs with media (/embedding, /embeddings, /v1/embeddings), as llama-server's
tokenize_input_subprompt and tokenize_oai_content_array read them (server-common.cpp):

- `{"prompt_string": "... <marker> ...", "multimodal_data": ["<base64>", ...]}`: raw base64
  items, one per marker of the prompt (the marker of /props);
- `{"content": [{"type": "text", ...}, {"type": "image_url", ...}, {"type": "input_audio",
  ...}, ...]}`: OpenAI's parts, each media part read as a chat's (URL, data URI, `file://`
  under --media-path, base64) and put as the marker in the text.

The body is read first (api/endpoints/embeddings/protocol.py makes a `PendingMedia` of each
such input), then, knowing the model's projector, `resolve_inputs` reads the bytes and makes
each a job's MediaPromptInput (small media inline, large ones through the object store).

Errors are llama-server's on this path: its embedding handler does not catch them, so what it
raises while it reads an input is a 500 (no projector: "Multimodal data provided, but model
does not support multimodal requests."; a media part the model does not take: "image input is
not supported - hint: ..."), but an `std::invalid_argument` (a bad data URI, `file://`
problems, an unknown part type) is a 400."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from api.chat.messages import media_not_supported
from api.media.refs import refs_of
from api.media.sources import MediaAccess, decode_base64, media_bytes
from api.tools.errors import json_type_name  # nlohmann::json's type_name()
from scheduler.contract.errors import InvalidRequest, ServerError
from scheduler.contract.jobs import EmbeddingInput, MediaPromptInput
from scheduler.contract.media import MAX_MEDIA_ITEMS
from scheduler.registry import ModelMeta
from storage.base import ObjectStore

NO_PROJECTOR = "Multimodal data provided, but model does not support multimodal requests."
UNSUPPORTED_PART = "unsupported content[].type"
TOKENIZE_FAILED = "Failed to tokenize prompt"
"""llama-server's words when mtmd_tokenize fails (markers and media that do not pair up)."""
MediaKind = Literal["image", "audio", "video"]
MODALITY_OF: dict[str, str] = {"image": "vision", "audio": "audio", "video": "video"}
PART_KINDS: dict[str, MediaKind] = {"image_url": "image", "input_audio": "audio",
                                    "input_video": "video", "video_url": "video"}


@dataclass
class MediaPart:
    """A media part of a `content` array: its kind and where its bytes are (a URL, data URI,
    `file://` path or base64)."""

    kind: MediaKind
    source: str


@dataclass
class PendingMedia:
    """An embedding input with media, as the body gave it; `resolve_inputs` reads its bytes."""

    prompt: Any = None
    """prompt_string (a string for a valid input: llama-server's type error otherwise)."""
    multimodal_data: list[Any] = field(default_factory=list)
    parts: list[str | MediaPart] | None = None
    """A `content` array: its texts and media parts in order (None: the prompt_string form)."""


def _string(value: Any) -> str:
    """A JSON value read as std::string, as nlohmann::json's get<std::string> does."""
    if not isinstance(value, str):
        raise ServerError(f"[json.exception.type_error.302] type must be string, but is "
                          f"{json_type_name(value)}")
    return value


def prompt_media(value: dict[str, Any]) -> PendingMedia:
    """`{"prompt_string", "multimodal_data"}`: llama-server iterates multimodal_data, so a
    single value (not an array) is one item."""
    data = value["multimodal_data"]
    items = data if isinstance(data, list) else [data]
    return PendingMedia(prompt=value["prompt_string"], multimodal_data=items)


def content_media(content: list[Any]) -> PendingMedia | str:
    """An OpenAI `content` array (checked to be one): its text alone when it has no media part,
    else its parts. A part of another type (or without one) is llama-server's 400."""
    parts: list[str | MediaPart] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text", "")
            parts.append(text if isinstance(text, str) else "")
        elif kind in PART_KINDS:
            parts.append(MediaPart(PART_KINDS[kind], _part_source(kind, part)))
        else:
            raise InvalidRequest(UNSUPPORTED_PART)
    if all(isinstance(p, str) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    return PendingMedia(parts=parts)


def _part_source(kind: str, part: dict[str, Any]) -> str:
    """Where a media part's bytes are: image_url.url; input_audio.data (or .url); the video
    forms' data or url (json_value: a field of the wrong type reads as empty)."""
    keys: tuple[str, ...] = ("url",)
    if kind == "image_url":
        holder = part.get("image_url")
    else:
        holder = part.get(kind)
        keys = ("data", "url")
    if not isinstance(holder, dict):
        return ""
    for key in keys:
        if key in holder:
            value = holder[key]
            return value if isinstance(value, str) else ""
    return ""


def has_media(inputs: list[Any]) -> bool:
    return any(isinstance(item, PendingMedia) for item in inputs)


async def resolve_inputs(inputs: list[EmbeddingInput | PendingMedia], meta: ModelMeta | None,
                         store: ObjectStore, access: MediaAccess) -> list[EmbeddingInput]:
    """Every input as a job's input: media read (in input order, as llama-server reads them)
    and made MediaRefs; at most MAX_MEDIA_ITEMS in the request (docs/limits.md)."""
    _check_count(sum(len(item.multimodal_data) if item.parts is None else
                     sum(isinstance(p, MediaPart) for p in item.parts)
                     for item in inputs if isinstance(item, PendingMedia)))
    resolved: list[EmbeddingInput] = []
    for item in inputs:
        if isinstance(item, PendingMedia):
            resolved.append(await _resolve(item, meta, store, access))
        else:
            resolved.append(item)
    return resolved


async def _resolve(item: PendingMedia, meta: ModelMeta | None, store: ObjectStore,
                   access: MediaAccess) -> EmbeddingInput:
    marker = meta.media_marker if meta is not None else ""
    if item.parts is None:
        if meta is None or not meta.takes_media():
            raise ServerError(NO_PROJECTOR)
        sources = [_string(entry) for entry in item.multimodal_data]
        prompt = _string(item.prompt)
        datas = [decode_base64(source) for source in sources]
    else:
        modalities = meta.modalities if meta is not None else {}
        datas, texts = [], []
        for part in item.parts:
            if isinstance(part, str):
                texts.append(part)
                continue
            if not modalities.get(MODALITY_OF[part.kind]):
                raise media_not_supported(part.kind)
            datas.append(await media_bytes(part.source, access))
            texts.append(marker)
        prompt = "".join(texts)
    if not datas:  # multimodal_data: [] : a prompt of text alone (a marker then pairs with none)
        if marker and marker in prompt:
            raise ServerError(TOKENIZE_FAILED)
        return prompt
    return MediaPromptInput(prompt=prompt, media=await refs_of(datas, store), marker=marker)


def _check_count(n: int) -> None:
    if n > MAX_MEDIA_ITEMS:
        raise InvalidRequest(f"too many media items: {n} (at most {MAX_MEDIA_ITEMS})")
