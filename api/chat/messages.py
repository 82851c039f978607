"""OpenAI chat input: messages and their content parts, and their validation (tools and
tool_choice: api/chat/request_tools.py).

The pydantic models describe the wire shapes (a wire model may embed them); the `validate_*`
functions take the request's values (models or plain JSON) and return what the chat template
and the tool grammar need, raising `InvalidRequest` (400) with llama-server's wording where it
has one, and llama-server's 500 for media the model cannot take (no multimodal projector).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest, LlamaqError, NotSupported, ServerError

ROLES = ("system", "developer", "user", "assistant", "tool")
Role = Literal["system", "developer", "user", "assistant", "tool"]

_MMPROJ_HINT = "hint: if this is unexpected, you may need to provide the mmproj"
_MEDIA_KINDS = {
    "image_url": "image",
    "input_image": "image",
    "input_audio": "audio",
    "input_video": "video",
    "video_url": "video",
    "file": "file",
}


@dataclass
class MediaInput:
    """What a model with a multimodal projector takes, and the media a request's messages
    hold: each media part becomes `marker` in the text and its URL or data goes to `sources`
    (api/media/ reads them), as llama-server's oaicompat_content_load_media."""

    marker: str
    vision: bool = False
    audio: bool = False
    video: bool = False
    sources: list[str] = field(default_factory=list)

    def takes(self, kind: str) -> bool:
        return (kind == "image" and self.vision) or (kind == "audio" and self.audio) \
            or (kind == "video" and self.video)


class Wire(DeferredModel):
    """A wire model of chat input: fields it does not know are ignored."""

    model_config = ConfigDict(extra="ignore")


class TextPart(Wire):
    type: Literal["text"]
    text: str


class ImageUrl(Wire):
    url: str
    detail: str | None = None


class ImageUrlPart(Wire):
    type: Literal["image_url"]
    image_url: ImageUrl | str


class InputAudio(Wire):
    data: str
    format: str | None = None


class InputAudioPart(Wire):
    type: Literal["input_audio"]
    input_audio: InputAudio


class InputVideoPart(Wire):
    type: Literal["input_video", "video_url"]
    input_video: dict[str, Any] | None = None
    video_url: dict[str, Any] | str | None = None


class FilePart(Wire):
    type: Literal["file"]
    file: dict[str, Any]


ContentPart = Annotated[
    TextPart | ImageUrlPart | InputAudioPart | InputVideoPart | FilePart,
    Field(discriminator="type"),
]


class FunctionCallIn(Wire):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(Wire):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(Wire):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


def dump_json(value: Any) -> str:
    def plain(obj: Any) -> Any:
        return obj.model_dump(exclude_unset=True) if isinstance(obj, BaseModel) else str(obj)

    return json.dumps(value, ensure_ascii=False, default=plain)


def errors_at(exc: ValidationError, where: str) -> str:
    """A validation error's messages, each at its place under `where` (`messages[0].role`)."""
    parts = []
    for err in exc.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        parts.append(f"{where}{loc}: {err['msg']}")
    return "; ".join(parts)


def _not_supported(kind: str) -> LlamaqError:
    if kind == "file":
        return NotSupported("file input is not supported by this server")
    return media_not_supported(kind)


def media_part_error(part_type: str) -> LlamaqError:
    """The error for a content part of type `part_type` (image_url, input_audio, ...)."""
    return _not_supported(_MEDIA_KINDS.get(part_type, "image"))


def media_not_supported(kind: str) -> ServerError:
    """Media for a model without a multimodal projector: llama-server's 500 and words."""
    return ServerError(f"{kind} input is not supported - {_MMPROJ_HINT}")


# messages


def _check_raw_message(index: int, raw: Any, media: MediaInput | None = None) -> None:
    """llama-server's checks on a message as JSON, before the model sees it."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"Expected 'message' to be an object, got {dump_json(raw)}")
    if "role" not in raw:
        raise InvalidRequest(f"Missing 'role' in message: {dump_json(raw)}")
    role = raw["role"]
    if role not in ROLES:
        raise InvalidRequest(
            f"Invalid role {dump_json(role)} in messages[{index}]: expected one of "
            f"{', '.join(ROLES)}"
        )
    content = raw.get("content")
    if content is not None and not isinstance(content, str | list):
        raise InvalidRequest("Expected 'content' to be a string or an array")
    for number, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, Mapping) or "type" not in part:
            raise InvalidRequest(f"Missing content part type: {dump_json(part)}")
        kind = part["type"]
        if kind in _MEDIA_KINDS and (media is None or not media.takes(_MEDIA_KINDS[kind])):
            raise _not_supported(_MEDIA_KINDS[kind])
        if kind in _MEDIA_KINDS:
            continue
        if kind != "text":
            raise InvalidRequest(f"Unsupported content part type: {dump_json(kind)}")
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"messages[{index}].content[{number}]: a text part needs a string 'text'"
            )


def _to_model(index: int, message: ChatMessageIn | Mapping[str, Any],
              media: MediaInput | None = None) -> ChatMessageIn:
    if isinstance(message, ChatMessageIn):
        return message
    _check_raw_message(index, message, media)
    try:
        return ChatMessageIn.model_validate(message)
    except ValidationError as exc:
        raise InvalidRequest(errors_at(exc, f"messages[{index}]")) from None


def _content_text(message: ChatMessageIn, media: MediaInput | None = None) -> str:
    """Content as one string: text parts joined with newlines, as llama.cpp does; a media
    part is the media marker (its source noted in `media`), with no newline before or after
    it (llama.cpp's concat_content_parts)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    text = ""
    after_marker = False
    for part in content:
        if isinstance(part, TextPart):
            text += ("\n" if text and not after_marker else "") + part.text
            after_marker = False
            continue
        kind = _MEDIA_KINDS[part.type]
        if media is None or not media.takes(kind):
            raise _not_supported(kind)
        media.sources.append(_media_source(part))
        text += media.marker
        after_marker = True
    return text


def _media_source(part: ContentPart) -> str:
    if isinstance(part, ImageUrlPart):
        return part.image_url if isinstance(part.image_url, str) else part.image_url.url
    if isinstance(part, InputAudioPart):
        return part.input_audio.data
    if isinstance(part, InputVideoPart):  # llama-server: `data`, else `url`, of either key
        given = part.input_video if part.type == "input_video" else part.video_url
        if isinstance(given, str):
            return given
        given = given or {}
        source = given.get("data", given.get("url", ""))
        return source if isinstance(source, str) else ""
    raise _not_supported(_MEDIA_KINDS.get(part.type, "file"))


def _tool_call_dict(call: ToolCallIn) -> dict[str, Any]:
    arguments = call.function.arguments
    out: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": call.function.name,
            "arguments": arguments if isinstance(arguments, str) else dump_json(arguments),
        },
    }
    if call.id:
        out["id"] = call.id
    return out


def _check_message(index: int, message: ChatMessageIn, content_given: bool) -> None:
    role = message.role
    if role == "assistant":
        if message.content is None and not message.tool_calls:
            raise InvalidRequest("Assistant message must contain either 'content' or 'tool_calls'!")
        return
    if not content_given or message.content is None:
        raise InvalidRequest(
            f"All non-assistant messages must contain 'content' (messages[{index}], role '{role}')"
        )
    if message.tool_calls:
        raise InvalidRequest(
            f"messages[{index}]: only assistant messages may have 'tool_calls', not '{role}'"
        )
    if role == "tool" and not message.tool_call_id:
        raise InvalidRequest(f"messages[{index}]: a 'tool' message must have a 'tool_call_id'")


def validate_messages(messages: Any, allow_empty: bool = False,
                      media: MediaInput | None = None) -> list[dict[str, Any]]:
    """Check the request's messages; return them as plain dicts for the chat template.

    Each dict has `role` and `content` (a string: text parts joined with "\\n"; "" for an
    assistant message that only calls tools), and, when given, `name`, `tool_call_id`,
    `reasoning_content` and `tool_calls` (OpenAI shape, `arguments` as JSON text).
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise InvalidRequest("Expected 'messages' to be an array")
    if not messages and not allow_empty:  # llama-server's Anthropic endpoint allows none
        raise InvalidRequest("'messages' must contain at least one message")
    out = []
    for index, raw in enumerate(messages):
        message = _to_model(index, raw, media)
        given = message.model_fields_set if isinstance(raw, ChatMessageIn) else set(raw)
        _check_message(index, message, "content" in given)
        item: dict[str, Any] = {"role": message.role, "content": _content_text(message, media)}
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [_tool_call_dict(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.reasoning_content is not None:
            item["reasoning_content"] = message.reasoning_content
        out.append(item)
    return out


def arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of validated messages whose tool-call `arguments` are objects, not JSON text —
    for templates that iterate them (`tool_call.arguments|items`, `|tojson`)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        converted = []
        for call in calls:
            arguments = call["function"]["arguments"]
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                parsed = arguments
            converted.append({**call, "function": {**call["function"], "arguments": parsed}})
        out.append({**message, "tool_calls": converted})
    return out
