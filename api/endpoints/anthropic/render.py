"""Results in the Anthropic Messages API's shapes, after llama-server's `to_json_anthropic`
(a message) and `to_json_anthropic_stream` (SSE events with `event:` names).

Content blocks come in the order thinking, text, tool_use; in a stream each block is opened
when its first delta arrives and all of them are closed at the end, in index order (a thinking
block gets an empty `signature_delta` first), then `message_delta` and `message_stop`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from api.chat.message import ChatDelta, ChatMessage
from scheduler.contract.errors import LlamaqError
from scheduler.contract.results import CompletionResult, Timings

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
Event = tuple[str, dict[str, Any]]


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def new_tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def stop_reason(result: CompletionResult, has_tool_calls: bool,
                stop_sequences: list[str]) -> tuple[StopReason, str | None]:
    """The stop reason and the stop sequence that ended the message (only one of the
    request's `stop_sequences`; the template's own stop strings end a turn)."""
    if result.stop_type not in ("word", "eos"):
        return "max_tokens", None
    if has_tool_calls:
        return "tool_use", None
    if result.stop_type == "word" and result.stopping_word in stop_sequences:
        return "stop_sequence", result.stopping_word
    return "end_turn", None


def usage_json(result: CompletionResult) -> dict[str, int]:
    cached = result.timings.cache_n
    return {"cache_read_input_tokens": cached,
            "input_tokens": result.tokens_evaluated - cached,
            "output_tokens": result.tokens_predicted}


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the `input` object ({} when they are not a JSON object)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(message: ChatMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.reasoning_content:
        blocks.append({"type": "thinking", "thinking": message.reasoning_content,
                       "signature": ""})
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id or new_tool_use_id(),
                       "name": call.name, "input": tool_input(call.arguments)})
    return blocks


def message_json(message_id: str, model: str, result: CompletionResult, message: ChatMessage,
                 stop_sequences: list[str]) -> dict[str, Any]:
    reason, sequence = stop_reason(result, bool(message.tool_calls), stop_sequences)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content_blocks(message),
        "model": model,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(result),
    }


def sse_event(name: str, data: dict[str, Any]) -> str:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {body}\n\n"


def sse_events(events: Iterable[Event]) -> str:
    return "".join(sse_event(name, data) for name, data in events)


def sse_error(error: LlamaqError) -> str:
    """An error after the stream started: an `error` event (the error object keeps the
    spec's code/message/type shape)."""
    return sse_event("error", {"type": "error", "error": error.to_info().to_wire()})


@dataclass
class _ToolBlock:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass
class MessageStream:
    """The event sequence of one streamed message: plain state, fed with parser deltas."""

    message_id: str
    model: str
    stop_sequences: list[str] = field(default_factory=list)
    _next_index: int = 0
    _thinking: int | None = None
    _text: int | None = None
    _reasoning_sent: str = ""
    _content_sent: str = ""
    _tools: dict[int, _ToolBlock] = field(default_factory=dict)

    def start(self, timings: Timings | None) -> list[Event]:
        cached = timings.cache_n if timings else 0
        prompt = timings.prompt_n if timings else 0
        return [("message_start", {"type": "message_start", "message": {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"cache_read_input_tokens": cached, "input_tokens": prompt,
                      "output_tokens": 0},
        }})]

    def feed(self, deltas: Iterable[ChatDelta]) -> list[Event]:
        events: list[Event] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._thinking_delta(delta.reasoning_content)
            if delta.content:
                events += self._text_delta(delta.content)
            for call in delta.tool_calls:
                events += self._tool_delta(call.index, call.id, call.name, call.arguments)
        return events

    def finish(self, result: CompletionResult, message: ChatMessage) -> list[Event]:
        """What the deltas did not carry yet (the parser's last word on the message), the
        block stops, message_delta and message_stop."""
        events = self._catch_up(message)
        for index in sorted(self._block_indices()):
            if index == self._thinking:
                events.append(_block_delta(index, {"type": "signature_delta", "signature": ""}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        reason, sequence = stop_reason(result, bool(message.tool_calls or self._tools),
                                       self.stop_sequences)
        events.append(("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": result.tokens_predicted},
        }))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _catch_up(self, message: ChatMessage) -> list[Event]:
        events: list[Event] = []
        reasoning = message.reasoning_content or ""
        if reasoning.startswith(self._reasoning_sent) and len(reasoning) > len(
                self._reasoning_sent):
            events += self._thinking_delta(reasoning[len(self._reasoning_sent):])
        if message.content.startswith(self._content_sent) and len(message.content) > len(
                self._content_sent):
            events += self._text_delta(message.content[len(self._content_sent):])
        for i, call in enumerate(message.tool_calls):
            sent = self._tools.get(i)
            if sent is None:
                events += self._tool_delta(i, call.id, call.name, call.arguments)
            elif call.arguments.startswith(sent.arguments):
                events += self._tool_delta(i, None, None, call.arguments[len(sent.arguments):])
        return events

    def _block_indices(self) -> list[int]:
        indices = [i for i in (self._thinking, self._text) if i is not None]
        return indices + [tool.index for tool in self._tools.values()]

    def _open(self, block: dict[str, Any]) -> tuple[int, Event]:
        index = self._next_index
        self._next_index += 1
        return index, ("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": block})

    def _thinking_delta(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._thinking is None:
            self._thinking, start = self._open({"type": "thinking", "thinking": ""})
            events.append(start)
        self._reasoning_sent += text
        events.append(_block_delta(self._thinking, {"type": "thinking_delta", "thinking": text}))
        return events

    def _text_delta(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._text is None:
            self._text, start = self._open({"type": "text", "text": ""})
            events.append(start)
        self._content_sent += text
        events.append(_block_delta(self._text, {"type": "text_delta", "text": text}))
        return events

    def _tool_delta(self, call_index: int, call_id: str | None, name: str | None,
                    arguments: str) -> list[Event]:
        events: list[Event] = []
        tool = self._tools.get(call_index)
        if tool is None:
            index, start = self._open({"type": "tool_use", "id": call_id or new_tool_use_id(),
                                       "name": name or "", "input": {}})
            tool = self._tools[call_index] = _ToolBlock(index, start[1]["content_block"]["id"],
                                                        name or "")
            events.append(start)
        if arguments:
            tool.arguments += arguments
            events.append(_block_delta(tool.index, {"type": "input_json_delta",
                                                    "partial_json": arguments}))
        return events


def _block_delta(index: int, delta: dict[str, Any]) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "index": index,
                                    "delta": delta})
