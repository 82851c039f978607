"""An answer held to a JSON schema (`response_format`, `json_schema`) read as llama.cpp reads
it: the JSON may come in a Markdown fence (```` ```json … ``` ````, as Ministral writes it), and
the fence is not content. Wraps any output parser: of its content, a leading ```` ```json ````
(and the whitespace after it) and a trailing ```` ``` ```` (and the whitespace before it) are
dropped; what may still turn out to be one of them is held back while streaming."""

from __future__ import annotations

from dataclasses import replace

from api.chat.message import ChatDelta, ChatMessage, OutputParser
from api.chat.tool_formats import WHITESPACE

OPEN, CLOSE = "```json", "```"


def strip_fence(content: str) -> str:
    """A whole answer's content without its fence (unchanged when it opens none), as the
    stream gives it."""
    stripped = content.lstrip(WHITESPACE)
    if not stripped.startswith(OPEN):
        return content
    rest = stripped[len(OPEN):].lstrip(WHITESPACE)
    body = rest.rstrip(WHITESPACE)
    return body[:-len(CLOSE)].rstrip(WHITESPACE) if body.endswith(CLOSE) else rest


class FencedJsonParser:
    def __init__(self, parser: OutputParser) -> None:
        self._parser = parser
        self._lead: str | None = ""  # content before it is known to open a fence; None: decided
        self._fenced = False
        self._tail = ""  # content that may be the closing fence

    def _content(self, text: str, final: bool) -> str:
        if self._lead is not None:
            self._lead += text
            stripped = self._lead.lstrip(WHITESPACE)
            if not final and (len(stripped) < len(OPEN) and OPEN.startswith(stripped)):
                return ""
            if stripped.startswith(OPEN):
                rest = stripped[len(OPEN):].lstrip(WHITESPACE)
                if not rest and not final:
                    self._lead = stripped  # wait for the first character after it
                    return ""
                self._fenced, text = True, rest
            else:
                text = self._lead
            self._lead = None
        if not self._fenced:
            return text
        text = self._tail + text
        if final:
            self._tail = ""
            body = text.rstrip(WHITESPACE)
            return body[:-len(CLOSE)].rstrip(WHITESPACE) if body.endswith(CLOSE) else text
        body = text.rstrip(WHITESPACE + "`")
        self._tail = text[len(body):]
        return body

    def _map(self, deltas: list[ChatDelta], final: bool) -> list[ChatDelta]:
        out = []
        for delta in deltas:
            if delta.content:
                delta = replace(delta, content=self._content(delta.content, False))
            if delta.content or delta.reasoning_content or delta.tool_calls:
                out.append(delta)
        if final:
            last = self._content("", True)
            if last:
                out.append(ChatDelta(content=last))
        return out

    def feed(self, text: str) -> list[ChatDelta]:
        return self._map(self._parser.feed(text), False)

    def flush(self) -> list[ChatDelta]:
        return self._map(self._parser.flush(), True)

    def finish(self) -> ChatMessage:
        message = self._parser.finish()
        return replace(message, content=strip_fence(message.content))
