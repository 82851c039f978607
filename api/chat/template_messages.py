"""Chat messages as a template takes them, normalized as llama-server does before it renders:
text content parts joined with "\\n" (or kept as parts when the template only reads parts),
`null` content as "", `developer` as `system` (except for gpt-oss templates), a leading system
message merged into the next one when the template ignores system messages, tool-call
arguments as objects when the template wants objects; and the final assistant message a
prefill continues."""

from __future__ import annotations

import json
from typing import Any

from api.chat.jinja_env import TemplateCaps
from api.chat.messages import media_part_error
from scheduler.contract.errors import InvalidRequest

MEDIA_PARTS = frozenset({"image_url", "input_audio", "input_video", "image", "file"})


def _content_text(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as a string, or its text parts (as given) when it has parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid 'content' type in {where}: expected string or array, "
                             f"got {type(content).__name__}")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise media_part_error(kind)
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"Unsupported content part in {where}: {json.dumps(part)}")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def join_parts(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


def _tool_calls(calls: Any, where: str, object_arguments: bool) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidRequest(f"Invalid 'tool_calls' in {where}: expected an array")
    normalized = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"Missing tool call function name in {where}")
        if call.get("type", "function") != "function":
            raise InvalidRequest(f"Unsupported tool call type in {where}: {call.get('type')!r}")
        arguments = function.get("arguments", {})
        if object_arguments and isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"Failed to parse tool call arguments as JSON in {where}: "
                                     f"{exc}") from None
        elif not object_arguments and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        normalized.append({**call, "type": "function",
                           "function": {**function, "arguments": arguments}})
    return normalized


def normalize_messages(messages: Any, caps: TemplateCaps, map_developer: bool,
               allow_empty: bool = False) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not (messages or allow_empty):
        raise InvalidRequest("'messages' must be a non-empty array")
    normalized = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"Expected {where} to be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"Missing 'role' in {where}")
        if role != "assistant" and "content" not in message:
            raise InvalidRequest("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in message and "tool_calls" not in message:
            raise InvalidRequest("Assistant message must contain either 'content' or "
                                 "'tool_calls'!")
        content = _content_text(message.get("content"), where)
        if not caps.typed_content_only:
            content = join_parts(content)
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out = {**message, "role": "system" if map_developer and role == "developer" else role,
               "content": content}
        if message.get("tool_calls"):
            out["tool_calls"] = _tool_calls(message["tool_calls"], where, caps.object_arguments)
        else:
            out.pop("tool_calls", None)
        normalized.append(out)
    if not caps.system_role and normalized and normalized[0]["role"] == "system":
        first = normalized.pop(0)
        if normalized:
            normalized[0] = {**normalized[0], "content": _merge(first["content"],
                                                                normalized[0]["content"])}
    return normalized


def _merge(system: Any, content: Any) -> Any:
    if isinstance(system, str) and isinstance(content, str):
        return f"{system}\n{content}"
    as_parts = [system] if isinstance(system, str) else system
    return [*([{"type": "text", "text": p} if isinstance(p, str) else p for p in as_parts]),
            *([{"type": "text", "text": content}] if isinstance(content, str) else content)]


CONTINUE_MODES = ("content", "reasoning_content")
"""`continue_final_message` as a string: what of the final message is continued (llama.cpp's
common_chat_continuation_parse; another string is no continuation)."""


def continuation_mode(continue_final_message: bool | str | None) -> bool | str | None:
    """The request's `continue_final_message` as `message_to_continue` takes it: a mode string
    of CONTINUE_MODES, or True/False/None."""
    if isinstance(continue_final_message, str):
        return continue_final_message if continue_final_message in CONTINUE_MODES else False
    return continue_final_message


def message_to_continue(messages: list[dict[str, Any]],
                        continue_final_message: bool | str | None) -> dict[str, Any] | None:
    """The final assistant message to continue, or None (llama-server's checks); a mode
    string (CONTINUE_MODES) continues as True does."""
    if not messages:
        return None
    last = messages[-1]
    if continue_final_message is False or (continue_final_message is None
                                           and last["role"] != "assistant"):
        return None
    if last["role"] != "assistant":
        raise InvalidRequest("continue_final_message needs an assistant message at the end "
                             "of the list")
    if continue_final_message is None and len(messages) >= 2 and messages[-2]["role"] == \
            "assistant":
        raise InvalidRequest("Cannot have 2 or more assistant messages at the end of the list.")
    if last.get("tool_calls"):
        raise InvalidRequest("Cannot continue an assistant message that contains tool calls.")
    return last


def harmony_history(message: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss templates read an assistant turn's reasoning as `thinking` (and its content
    not at all beside tool calls): llama.cpp's common/parsers/gpt-oss.cpp copies it so."""
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        return message
    out = {**message, "thinking": reasoning}
    if message.get("tool_calls"):
        out.pop("content", None)
    return out
