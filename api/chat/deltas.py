"""What the output parser (api/chat/parsing.py) hands out as it reads: the deltas of a stream,
merged where they can be, and the whole message they add up to. Whitespace at the end of
content is held until more content follows it; a tool call drops what was held."""

from __future__ import annotations

from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta, push_text
from api.chat.tool_formats import WHITESPACE, ParsedCall, random_string

Partial = tuple[str, str, str, "str | None"]
"""A call being written: name, the arguments certain so far, the arguments guessed whole, its
id where the model wrote one (streamed_calls.py)."""


class Deltas:
    def __init__(self, *, legacy: bool, parallel: bool) -> None:
        """`legacy` (--reasoning-format deepseek-legacy): reasoning is content too;
        without `parallel` only the answer's first call is kept."""
        self.legacy = legacy
        self.parallel = parallel
        self.thinking = False  # reasoning text emitted yet
        self.skip_ws = False  # drop the whitespace before the next text (after </think>)
        self.held = ""  # whitespace read in the body, emitted only if content follows
        self.tool_calls: list[ToolCall] = []
        self._block: list[ToolCall] = []  # the open block's calls, streamed as written
        self.guess = ""  # the last one's arguments as they would be if the block ended here
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._out: list[ChatDelta] = []

    def take(self) -> list[ChatDelta]:
        """The deltas since the last take."""
        out, self._out = self._out, []
        return out

    def message(self) -> ChatMessage:
        reasoning = "".join(self._reasoning)
        return ChatMessage(
            content="".join(self._content),
            reasoning_content=reasoning or None,
            tool_calls=list(self.tool_calls),
        )

    def _push(self, *, content: str = "", reasoning: str = "") -> None:
        push_text(self._out, content=content, reasoning=reasoning)

    def content(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._push(content=text)

    def thought(self, text: str) -> None:
        if text:
            self.thinking = True
            self._reasoning.append(text)
            self._push(reasoning=text, content=text if self.legacy else "")
            if self.legacy:
                self._content.append(text)

    def body(self, text: str) -> None:
        """Body text: trailing whitespace is held until more content follows it."""
        if self.skip_ws:
            stripped = text.lstrip(WHITESPACE)
            if not stripped:
                return
            text, self.skip_ws = stripped, False
        body = text.rstrip(WHITESPACE)
        if body:
            self.content(self.held + body)
            self.held = text[len(body) :]
        else:
            self.held += text

    @property
    def streaming(self) -> ToolCall | None:
        """The call of the open block whose arguments are being streamed (its last begun)."""
        return self._block[-1] if self._block else None

    def stream_call(self, found: Partial | list[Partial] | None) -> None:
        """The calls of a block still being written (streamed_calls.py: name, the arguments
        certain so far, the arguments guessed whole, its id where the model wrote one; a
        reader gives the block's first call, or each call begun so far): a call's first delta
        once its name is known, then each new piece of its arguments."""
        partials = found if isinstance(found, list) else [found] if found else []
        for i, (name, certain, guess, ident) in enumerate(partials):
            if i == len(self._block):  # a call begins
                if not self.parallel and self.tool_calls:
                    break
                self.held = ""
                call = ToolCall(id=ident or random_string(), name=name, arguments="")
                self._block.append(call)
                self.tool_calls.append(call)
                self._out.append(ChatDelta(tool_calls=[ToolCallDelta(
                    len(self.tool_calls) - 1, call.id, name, "")]))
            call = self._block[i]
            if call.name == name and certain.startswith(call.arguments) and \
                    len(certain) > len(call.arguments):
                piece = certain[len(call.arguments):]
                call.arguments = certain
                self._out.append(ChatDelta(tool_calls=[ToolCallDelta(
                    self.tool_calls.index(call), arguments=piece)]))
            if i == len(self._block) - 1:
                self.guess = guess

    def end_stream(self, calls: list[ParsedCall] | None) -> list[ParsedCall]:
        """The streamed calls' block ends: their arguments completed from the block's calls
        (`None`: the block did not parse, the calls are kept, the last with the arguments
        guessed so far); returns the block's other calls."""
        block, self._block = self._block, []
        for i, call in enumerate(block):
            final = calls[i].arguments if calls and i < len(calls) else \
                self.guess if i == len(block) - 1 else call.arguments
            piece = final[len(call.arguments):] if final.startswith(call.arguments) else ""
            call.arguments += piece
            if piece:
                self._out.append(ChatDelta(tool_calls=[ToolCallDelta(
                    self.tool_calls.index(call), arguments=piece)]))
        return (calls or [])[len(block):]

    def calls(self, calls: list[ParsedCall]) -> None:
        self.held = ""  # whitespace before a call is dropped; after it, held as usual
        calls = self.end_stream(calls) if self.streaming is not None else calls
        if not self.parallel:
            calls = [] if self.tool_calls else calls[:1]
        for call in calls:
            index = len(self.tool_calls)
            call_id = call.id or random_string()
            tool_call = ToolCall(id=call_id, name=call.name, arguments=call.arguments)
            self.tool_calls.append(tool_call)
            self._out.append(
                ChatDelta(tool_calls=[ToolCallDelta(index, tool_call.id, tool_call.name, "")])
            )
            self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, arguments=call.arguments)]))
