"""Functionary v3.2's output split into content and tool calls, whole or as a stream, as
llama.cpp's parser (common/parsers/functionary-v3-2.cpp) reads it.

The prompt ends with `>>>`; the model writes a recipient, a newline and that recipient's
message, and `>>>` before each next one:

    all\\nText for the user>>>get_weather\\n{"location": "Paris"}>>>special_function\\n{...}

`all` is content (streamed); any other recipient is a tool call whose message is its JSON
arguments (emitted once complete). A recipient that is not a name, or arguments that are not
a JSON object, stay content (llama.cpp fails the request).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection

from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta, push_text
from api.chat.partial_calls import partial_arguments
from api.chat.tool_formats import (
    WHITESPACE,
    dump_arguments,
    load_json,
    partial_suffix,
    random_string,
)

RECIPIENT_MARK = ">>>"
CONTENT_RECIPIENT = "all"
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_MAX_RECIPIENT = 128


class _Phase(enum.Enum):
    RECIPIENT = "recipient"
    CONTENT = "content"
    CALL = "call"
    DONE = "done"


class FunctionaryParser:
    """The same interface as ChatOutputParser: `feed` pieces, `flush`, `finish`."""

    def __init__(self, *, tools: bool, prompt: str = "",
                 tool_names: Collection[str] | None = None,
                 parallel_tool_calls: bool = True) -> None:
        self._tools = tools
        self._tool_names = frozenset(tool_names) if tool_names is not None else None
        self._parallel = parallel_tool_calls
        self._text = ""
        self._pos = 0
        self._name = ""
        self._call_from = 0
        self._phase = (_Phase.RECIPIENT if prompt.endswith(RECIPIENT_MARK) else _Phase.CONTENT)
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._out: list[ChatDelta] = []

    def feed(self, text: str) -> list[ChatDelta]:
        if self._phase is _Phase.DONE:
            raise RuntimeError("FunctionaryParser.feed() after flush()/finish()")
        self._text += text
        while self._step(final=False):
            pass
        return self._take()

    def flush(self) -> list[ChatDelta]:
        while self._phase is not _Phase.DONE:
            if not self._step(final=True):
                self._phase = _Phase.DONE
        return self._take()

    def finish(self) -> ChatMessage:
        self.flush()
        return ChatMessage(content="".join(self._content), tool_calls=list(self._calls))

    def _take(self) -> list[ChatDelta]:
        out, self._out = self._out, []
        return out

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        self._content.append(text)
        push_text(self._out, content=text)

    def _step(self, *, final: bool) -> bool:
        if self._phase is _Phase.RECIPIENT:
            return self._step_recipient(final)
        if self._phase is _Phase.CONTENT:
            return self._step_content(final)
        if self._phase is _Phase.CALL:
            return self._step_call(final)
        return False

    def _step_recipient(self, final: bool) -> bool:
        text = self._text
        newline = text.find("\n", self._pos)
        if newline < 0 and not final and len(text) - self._pos <= _MAX_RECIPIENT:
            return False
        recipient = text[self._pos : newline] if newline >= 0 else text[self._pos :]
        if newline < 0 and final and self._tools and _NAME.fullmatch(recipient):
            self._phase = _Phase.DONE  # a recipient cut short: dropped, as llama.cpp drops it
            return False
        if newline >= 0 and recipient == CONTENT_RECIPIENT:
            self._pos = newline + 1
            self._phase = _Phase.CONTENT
            return True
        if newline >= 0 and _NAME.fullmatch(recipient) and self._tools:
            self._name = recipient
            self._pos = self._call_from = newline + 1
            self._phase = _Phase.CALL
            return True
        self._phase = _Phase.CONTENT  # not a recipient: what follows is text
        return True

    def _step_content(self, final: bool) -> bool:
        text = self._text
        at = text.find(RECIPIENT_MARK, self._pos)
        if at >= 0:
            self._emit_content(text[self._pos : at])
            self._pos = at + len(RECIPIENT_MARK)
            self._phase = _Phase.RECIPIENT
            return True
        hold = 0 if final else partial_suffix(text, self._pos, (RECIPIENT_MARK,))
        self._emit_content(text[self._pos : len(text) - hold])
        self._pos = len(text) - hold
        if final:
            self._phase = _Phase.DONE
            return True
        return False

    def _step_call(self, final: bool) -> bool:
        text = self._text
        at = text.find(RECIPIENT_MARK, self._pos)
        if at < 0 and not final:
            return False
        end = at if at >= 0 else len(text)
        body = text[self._call_from : end]
        self._finish_call(body, cut_short=at < 0)
        self._pos = end + len(RECIPIENT_MARK) if at >= 0 else end
        self._phase = _Phase.RECIPIENT if at >= 0 else _Phase.DONE
        return True

    def _finish_call(self, body: str, cut_short: bool = False) -> None:
        """A call's arguments read once complete; a call the answer ends in whose arguments are
        cut short is kept with them as far as they go (unclosed), as llama.cpp keeps it."""
        try:
            arguments = load_json(body.strip(WHITESPACE) or "{}")
            text = dump_arguments(arguments)
        except ValueError:
            partial = partial_arguments(body) if cut_short else None
            arguments, text = ({}, partial[0]) if partial else (None, "")
        wanted = self._tool_names is None or self._name in self._tool_names
        if not isinstance(arguments, dict) or not wanted:
            self._emit_content(f"{self._name}\n{body}")
            return
        if self._calls and not self._parallel:
            return
        index = len(self._calls)
        call = ToolCall(id=random_string(), name=self._name, arguments=text)
        self._calls.append(call)
        self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, call.id, call.name, "")]))
        self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, arguments=call.arguments)]))
