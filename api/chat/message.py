"""A chat answer as the parsers hand it over (api/chat/parsing.py): the whole message, or the
deltas of a stream (they add up to the message); the renderers of each API shape it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass
class ToolCallDelta:
    """One entry of an OpenAI stream chunk's `delta.tool_calls`: the first delta of a call has
    `index`, `id`, `name` and `arguments == ""`; later ones carry only `index` and arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ChatMessage:
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ChatDelta:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


def push_text(out: list[ChatDelta], *, content: str = "", reasoning: str = "") -> None:
    """Adds text to the last delta of `out` when it carries no tool call (and reasoning does not
    follow content in it), else opens a new one: one chunk per kind of text."""
    last = out[-1] if out else None
    if last is not None and not last.tool_calls and not (reasoning and last.content):
        last.content += content
        last.reasoning_content += reasoning
    else:
        out.append(ChatDelta(content=content, reasoning_content=reasoning))


class OutputParser(Protocol):
    """What every output parser offers (parsing.py's ChatOutputParser, harmony.py's
    HarmonyParser): `feed` pieces of generated text and get the deltas that are certain,
    `flush` at the end for the last ones, `finish` for the whole message."""

    def feed(self, text: str) -> list[ChatDelta]: ...

    def flush(self) -> list[ChatDelta]: ...

    def finish(self) -> ChatMessage: ...
