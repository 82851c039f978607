"""gpt-oss's output (OpenAI's harmony format) split into content, reasoning and tool calls,
whole or as a stream, as llama.cpp's gpt-oss parser (common/parsers/gpt-oss.cpp) reads it.

The answer is a run of messages; the prompt already opened the first one
(`<|start|>assistant`), each later one starts with `<|start|>assistant`:

    HEADER<|message|>BODY<|end|>          HEADER: <|channel|>NAME, ` to=RECIPIENT` before or
                                                  after the channel, ` <|constrain|>TYPE`

- `analysis`: reasoning (several blocks are joined); with `reasoning_format` none it stays in
  `content`, header and `<|end|>` included, as llama.cpp keeps it; `deepseek-legacy` is
  `auto` here, streamed or not (llama-server's gpt-oss parser ignores it: checked against its
  binary);
- `commentary` (no recipient, a preamble) and `final`: content;
- recipient `functions.NAME`: a tool call whose body is the JSON arguments (taken when tools
  are parsed and NAME is one of them, else dropped); another recipient (a built-in such as
  `python` or `container.exec`) is dropped, as llama.cpp drops unsolicited calls; ` to=assistant`
  (a stray header gpt-oss-20b writes) is ignored;
- `<|call|>` and `<|return|>` end a message like `<|end|>` (they end generation anyway).

Where llamaq differs: text that is not harmony at all (a model that does not write channels)
is content, where llama.cpp fails the request; with `parallel_tool_calls` every call message
is taken (llama.cpp stops at the first one, which `<|call|>` makes the usual case), without it
only the first. Calls are emitted once their arguments are complete.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection

from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta, push_text
from api.chat.partial_calls import partial_arguments
from api.chat.reasoning_tags import check_reasoning_format
from api.chat.tool_formats import (
    WHITESPACE,
    dump_arguments,
    load_json,
    partial_suffix,
    random_string,
)

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
CALL = "<|call|>"
RETURN = "<|return|>"
ROLE = START + "assistant"
PRESERVED_TOKENS = (CHANNEL, CONSTRAIN, MESSAGE, START, END)
"""The tokens the worker must write as text for this parser (llama.cpp's preserved_tokens)."""

_TERMINATORS = (END, CALL, RETURN, START)
_HEADER_STARTS = (CHANNEL, " to=")
_MAX_HEADER = 512
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"([A-Za-z0-9_\-]*)")


def is_harmony_template(template_source: str) -> bool:
    """llama.cpp's detection: the template writes `<|channel|>`."""
    return CHANNEL in template_source


class _Kind(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    CALL = "call"
    DROP = "drop"


class _Phase(enum.Enum):
    HEADER = "header"  # reading a message header, up to <|message|>
    BODY = "body"  # inside a message body
    BETWEEN = "between"  # after a message: `<|start|>assistant` comes next
    RAW = "raw"  # text outside harmony's frame: content up to the next <|start|>
    DONE = "done"


def _prompt_state(prompt: str) -> tuple[_Phase, str]:
    """Where the rendered prompt leaves the answer: in a header (the usual
    `<|start|>assistant`), or inside a message it opened (a continued final message)."""
    at = prompt.rfind(ROLE)
    if at < 0:
        return _Phase.HEADER, ""
    tail = prompt[at + len(ROLE) :]
    if any(t in tail for t in (END, CALL, RETURN)):
        return _Phase.BETWEEN, ""
    if MESSAGE in tail:
        return _Phase.BODY, tail[: tail.rfind(MESSAGE)]
    return _Phase.HEADER, tail if tail.startswith(_HEADER_STARTS) else ""


class HarmonyParser:
    """The same interface as ChatOutputParser: `feed` pieces, `flush`, `finish`."""

    def __init__(
        self,
        *,
        reasoning_format: str,
        tools: bool,
        prompt: str = "",
        tool_names: Collection[str] | None = None,
        parallel_tool_calls: bool = True,
    ) -> None:
        self._format = check_reasoning_format(reasoning_format)
        self._tools = tools
        self._tool_names = frozenset(tool_names) if tool_names is not None else None
        self._parallel = parallel_tool_calls
        self._text = ""
        self._pos = 0
        self._phase, header = _prompt_state(prompt)
        self._kind = _Kind.CONTENT
        self._call_name = ""
        self._call_from = 0
        self._blank = ""  # leading whitespace of the reasoning, held
        self._end_tag = ""  # what follows a reasoning body in content (format none)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._out: list[ChatDelta] = []
        if self._phase is _Phase.BODY:
            self._open_body(header, echo=False)
        elif header:
            self._text = header  # a header the prompt began: read on from it

    # public interface

    def feed(self, text: str) -> list[ChatDelta]:
        """Add generated text; returns the deltas that are now certain (possibly none)."""
        if self._phase is _Phase.DONE:
            raise RuntimeError("HarmonyParser.feed() after flush()/finish()")
        self._text += text
        while self._step(final=False):
            pass
        if self._pos > 4096 and not (self._phase is _Phase.BODY and self._kind is _Kind.CALL):
            self._text, self._call_from = self._text[self._pos :], self._call_from - self._pos
            self._pos = 0
        return self._take()

    def flush(self) -> list[ChatDelta]:
        """End of generation: decide everything held back; returns the last deltas."""
        while self._phase is not _Phase.DONE:
            if not self._step(final=True):
                self._phase = _Phase.DONE
        return self._take()

    def finish(self) -> ChatMessage:
        """The whole message (ends the stream first if `flush()` was not called)."""
        self.flush()
        reasoning = "".join(self._reasoning)
        return ChatMessage(content="".join(self._content), reasoning_content=reasoning or None,
                           tool_calls=list(self._calls))

    # emission

    def _take(self) -> list[ChatDelta]:
        out, self._out = self._out, []
        return out

    def _push(self, *, content: str = "", reasoning: str = "") -> None:
        push_text(self._out, content=content, reasoning=reasoning)

    def _emit_content(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._push(content=text)

    def _emit_reasoning(self, text: str) -> None:
        """Reasoning text; whitespace before any other reasoning is held (whitespace-only
        reasoning is dropped, as llama.cpp drops it)."""
        if not self._reasoning and not text.strip(WHITESPACE):
            self._blank += text
            return
        text, self._blank = self._blank + text, ""
        self._reasoning.append(text)
        self._push(reasoning=text)

    def _emit_body(self, text: str) -> None:
        if self._kind is _Kind.REASONING:
            self._emit_reasoning(text)
        elif self._kind is _Kind.CONTENT:
            self._emit_content(text)

    def _emit_call(self, name: str, arguments: str) -> None:
        index = len(self._calls)
        call = ToolCall(id=random_string(), name=name, arguments=arguments)
        self._calls.append(call)
        self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, call.id, call.name, "")]))
        self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, arguments=arguments)]))

    # the state machine: each step returns whether it made progress

    def _step(self, *, final: bool) -> bool:
        if self._phase is _Phase.HEADER:
            return self._step_header(final)
        if self._phase is _Phase.BODY:
            return self._step_body(final)
        if self._phase is _Phase.BETWEEN:
            return self._step_between(final)
        if self._phase is _Phase.RAW:
            return self._step_raw(final)
        return False

    def _step_header(self, final: bool) -> bool:
        text = self._text
        rest = text[self._pos :]
        if not rest:
            return False
        if not any(rest.startswith(s) or s.startswith(rest) for s in _HEADER_STARTS):
            self._phase = _Phase.RAW
            return True
        end = text.find(MESSAGE, self._pos)
        broken = any(t in rest[: end - self._pos if end >= 0 else len(rest)]
                     for t in _TERMINATORS)
        if broken or (end < 0 and len(rest) > _MAX_HEADER):
            self._phase = _Phase.RAW
            return True
        if end < 0:
            return False  # at the end, an unfinished header is dropped
        header = text[self._pos : end]
        self._pos = end + len(MESSAGE)
        self._open_body(header, echo=True)
        return True

    def _open_body(self, header: str, *, echo: bool) -> None:
        """A message's header has been read: what its body is."""
        recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
        channels = _CHANNEL_NAME.findall(header)
        channel = channels[-1] if channels else ""
        self._phase = _Phase.BODY
        self._end_tag = ""
        if recipients:
            name = recipients[-1].removeprefix("functions.")
            wanted = (self._tools and recipients[-1].startswith("functions.")
                      and (self._tool_names is None or name in self._tool_names)
                      and (self._parallel or not self._calls))
            self._kind = _Kind.CALL if wanted else _Kind.DROP
            self._call_name = name
            self._call_from = self._pos
        elif channel == "analysis" and self._format != "none":
            self._kind = _Kind.REASONING
        elif channel == "analysis":
            self._kind = _Kind.CONTENT
            if echo:
                self._emit_content(header + MESSAGE)
            self._end_tag = END
        else:
            self._kind = _Kind.CONTENT

    def _step_body(self, final: bool) -> bool:
        text = self._text
        found = [(at, tag) for tag in _TERMINATORS if (at := text.find(tag, self._pos)) >= 0]
        if found:
            at, tag = min(found)
            self._body_text(text[self._pos : at])
            self._pos = at if tag == START else at + len(tag)
            self._end_message(at, tag)
            self._phase = _Phase.BETWEEN
            return True
        if final:
            self._body_text(text[self._pos :])
            self._pos = len(text)
            self._end_message(len(text), cut_short=True)
            self._phase = _Phase.DONE
            return True
        if self._kind is _Kind.CALL:
            return False
        hold = partial_suffix(text, self._pos, _TERMINATORS)
        self._body_text(text[self._pos : len(text) - hold])
        self._pos = len(text) - hold
        return False

    def _body_text(self, text: str) -> None:
        if self._kind is not _Kind.CALL:
            self._emit_body(text)

    def _end_message(self, body_end: int, tag: str = "", cut_short: bool = False) -> None:
        """A message's body ends at body_end (at `tag`, or with the text): a call is parsed,
        a reasoning block kept in content gets its end tag."""
        if self._phase is not _Phase.BODY:
            return
        if self._kind is _Kind.CALL:
            self._finish_call(self._text[self._call_from : body_end], cut_short)
        elif self._end_tag and tag == END:
            self._emit_content(self._end_tag)
        self._kind = _Kind.CONTENT

    def _finish_call(self, body: str, cut_short: bool = False) -> None:
        """The call's JSON arguments; cut short by the end of the answer, as far as they go
        (unclosed), as llama.cpp keeps them."""
        partial = None
        try:
            arguments = load_json(body.strip(WHITESPACE)) if body.strip(WHITESPACE) else {}
        except ValueError:
            arguments = None
            partial = partial_arguments(body) if cut_short else None
        if partial is not None:
            self._emit_call(self._call_name, partial[0])
        elif isinstance(arguments, dict):
            self._emit_call(self._call_name, dump_arguments(arguments))
        else:  # not a call after all: its text is content, as the other formats keep it
            self._emit_content(body)

    def _step_between(self, final: bool) -> bool:
        text = self._text
        while self._pos < len(text) and text[self._pos] in WHITESPACE:
            self._pos += 1
        rest = text[self._pos :]
        if rest.startswith(ROLE):
            self._pos += len(ROLE)
            self._phase = _Phase.HEADER
            return True
        if not rest or (ROLE.startswith(rest) and not final):
            if final:
                self._phase = _Phase.DONE
            return False
        if ROLE.startswith(rest):  # a cut-off `<|start|>…` at the very end
            self._pos = len(text)
            self._phase = _Phase.DONE
            return True
        self._phase = _Phase.RAW
        return True

    def _step_raw(self, final: bool) -> bool:
        text = self._text
        at = text.find(START, self._pos)
        if at >= 0:
            self._emit_content(text[self._pos : at])
            self._pos = at
            self._phase = _Phase.BETWEEN
            return True
        hold = 0 if final else partial_suffix(text, self._pos, (START,))
        self._emit_content(text[self._pos : len(text) - hold])
        self._pos = len(text) - hold
        if final:
            self._phase = _Phase.DONE
            return True
        return False
