"""Splitting model output into content, reasoning and tool calls, whole or as a stream.

`ChatOutputParser` reads the generated text in pieces (`feed`) and hands back OpenAI-style
deltas; it never emits text that may still turn out to be part of a think tag or of a tool call
(partial tags are held back until the next piece decides). `flush()` ends the stream (the last
deltas), `finish()` returns the whole message. The deltas of a stream add up to `finish()`.

Reasoning (`reasoning_format`, as llama-server's --reasoning-format):
- none: everything stays in `content` (with the prompt's opening tag first when the prompt
  opened the block, as llama-server parses the generation prompt with the answer);
- deepseek, auto: a leading `<think>…</think>` block (or, with `thinking_forced_open`, the text up
  to `</think>` when the prompt already opened it) goes to `reasoning_content`, stripped;
  whitespace-only reasoning is dropped; an unclosed block at the end is all reasoning;
- deepseek-legacy: as deepseek, and `content` also keeps the block, tags included.
The tags are `<think>`/`</think>` unless the template uses `[THINK]`, `<|START_THINKING|>` or
`<seed:think>`.

Tool calls (with `tools=True`): the formats of tool_formats.py, and those of the template's family
(chat_formats.py, tagged_calls.py; gpt-oss and Functionary v3.2 have parsers of their own,
harmony.py and functionary.py). A bare JSON call is recognised
only at the start of the answer (or right after another bare call); tagged formats anywhere.
Text that looks like a call but does not parse stays content. Calls get llama-server's random
32-character ids unless the model wrote one; `arguments` is always JSON text.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from api.chat.chat_formats import GENERIC, TO_THE_END, BlockParser, ChatFormat
from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta
from api.chat.reasoning_tags import check_reasoning_format, reasoning_tags
from api.chat.tagged_calls import ParamTypes, parse_tool_call_block
from api.chat.tool_formats import (
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    WHITESPACE,
    JsonScanner,
    ParsedCall,
    call_from_object,
    calls_from_json,
    generic_response,
    known_names,
    load_json,
    parse_deepseek_calls,
    parse_function_tag,
    parse_python_tag,
    partial_suffix,
    random_string,
)

MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
_MISTRAL_ARGS = "[ARGS]"
_MISTRAL_CALL_ID = "[CALL_ID]"
_MAX_MISTRAL_HEADER = 256

_BLOCKS: dict[str, tuple[str, BlockParser]] = {
    "<tool_call>": ("</tool_call>", parse_tool_call_block),
    "<function=": ("</function>", lambda inner, _types: parse_function_tag(inner)),
    DEEPSEEK_CALLS_BEGIN: (DEEPSEEK_CALLS_END, lambda inner, _types: parse_deepseek_calls(inner)),
}


class _Phase(enum.Enum):
    START = "start"  # before the answer: a think block may open
    REASONING = "reasoning"  # inside the think block
    BODY = "body"  # content, watching for tool calls
    JSON = "json"  # a bare JSON value at the start of the answer
    BLOCK = "block"  # inside a tagged call block, waiting for its end tag
    MISTRAL = "mistral"  # after [TOOL_CALLS]
    PYTHON = "python"  # after <|python_tag|>: runs to the end
    DONE = "done"


class ChatOutputParser:
    def __init__(
        self,
        *,
        reasoning_format: str,
        tools: bool,
        template_source: str = "",
        thinking_forced_open: bool = False,
        tool_names: Collection[str] | None = None,
        chat_format: ChatFormat = GENERIC,
        param_types: ParamTypes | None = None,
        parallel_tool_calls: bool = True,
        opened: str = "",
    ) -> None:
        """`tool_names`, when given, is the set of tools a bare JSON call may name: a JSON answer
        naming anything else stays content (tagged calls are taken whatever their name).
        `chat_format` (chat_formats.py): the template's family, whose own blocks are read beside
        the generic ones; `param_types`: the tools' parameter types, for values written as
        text; without `parallel_tool_calls` only the answer's first call is kept. `opened`: what
        the prompt wrote from the think tag on when it opened the block (`<think>\n`): with
        `reasoning_format` none the answer's content starts with it, as llama-server's does."""
        reasoning = check_reasoning_format(reasoning_format) != "none"
        self._legacy = reasoning_format == "deepseek-legacy"
        self._tools = tools
        self._types: ParamTypes = param_types or {}
        self._parallel = parallel_tool_calls
        self._blocks = {**_BLOCKS, **chat_format.blocks}
        self._dropped = chat_format.dropped
        self._call_markers = (*self._blocks, MISTRAL_TOOL_CALLS, PYTHON_TAG) if tools else ()
        self._markers = (*self._call_markers, *self._dropped)
        self._tool_names = frozenset(tool_names) if tool_names is not None else None
        self._start_tag, self._end_tag = reasoning_tags(template_source)
        self._text = ""
        self._pos = 0
        self._phase = _Phase.START if reasoning else _Phase.BODY
        self._thinking = False  # reasoning text emitted yet
        self._skip_ws = False  # drop the whitespace before the next text (after </think>)
        self._at_start = True  # a bare JSON call may begin here
        self._held = ""  # whitespace read in the body, emitted only if content follows
        self._call_start = 0  # where the current call block's marker starts
        self._block: tuple[str, BlockParser] | None = None
        self._scanner: JsonScanner | None = None
        self._scan_from = 0
        self._mistral_step = "begin"
        self._mistral_header: tuple[str, str | None] = ("", None)
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []
        self._out: list[ChatDelta] = []
        if reasoning and thinking_forced_open:
            self._enter_reasoning()
        elif thinking_forced_open:
            self._emit_body(opened or self._start_tag)
            self._at_start = False

    # public interface

    def feed(self, text: str) -> list[ChatDelta]:
        """Add generated text; returns the deltas that are now certain (possibly none)."""
        if self._phase is _Phase.DONE:
            raise RuntimeError("ChatOutputParser.feed() after flush()/finish()")
        self._text += text
        while self._step(final=False):
            pass
        self._compact()
        return self._take()

    def flush(self) -> list[ChatDelta]:
        """End of generation: decide everything held back; returns the last deltas."""
        while self._phase is not _Phase.DONE:
            self._step(final=True)
        return self._take()

    def finish(self) -> ChatMessage:
        """The whole message (ends the stream first if `flush()` was not called)."""
        self.flush()
        reasoning = "".join(self._reasoning)
        return ChatMessage(
            content="".join(self._content),
            reasoning_content=reasoning or None,
            tool_calls=list(self._calls),
        )

    # emission

    def _take(self) -> list[ChatDelta]:
        out, self._out = self._out, []
        return out

    def _push(self, *, content: str = "", reasoning: str = "") -> None:
        last = self._out[-1] if self._out else None
        if last is not None and not last.tool_calls and not (reasoning and last.content):
            last.content += content
            last.reasoning_content += reasoning
        else:
            self._out.append(ChatDelta(content=content, reasoning_content=reasoning))

    def _emit_content(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._push(content=text)

    def _emit_thought(self, text: str) -> None:
        if text:
            self._thinking = True
            self._reasoning.append(text)
            self._push(reasoning=text, content=text if self._legacy else "")
            if self._legacy:
                self._content.append(text)

    def _emit_body(self, text: str) -> None:
        """Body text: trailing whitespace is held until more content follows it."""
        if self._skip_ws:
            stripped = text.lstrip(WHITESPACE)
            if not stripped:
                return
            text, self._skip_ws = stripped, False
        body = text.rstrip(WHITESPACE)
        if body:
            self._emit_content(self._held + body)
            self._held = text[len(body) :]
        else:
            self._held += text

    def _emit_calls(self, calls: list[ParsedCall]) -> None:
        self._held = ""  # whitespace before a call is dropped; after it, held as usual
        if not self._parallel:
            calls = [] if self._calls else calls[:1]
        for call in calls:
            index = len(self._calls)
            call_id = call.id or random_string()
            tool_call = ToolCall(id=call_id, name=call.name, arguments=call.arguments)
            self._calls.append(tool_call)
            self._out.append(
                ChatDelta(tool_calls=[ToolCallDelta(index, tool_call.id, tool_call.name, "")])
            )
            self._out.append(ChatDelta(tool_calls=[ToolCallDelta(index, arguments=call.arguments)]))

    def _compact(self) -> None:
        """Forget text already consumed, where no phase looks back at it."""
        if self._pos > 4096 and self._phase in (_Phase.BODY, _Phase.REASONING, _Phase.START):
            self._text = self._text[self._pos :]
            self._pos = 0

    # the state machine: each step returns whether it made progress

    def _step(self, *, final: bool) -> bool:
        phase = self._phase
        if phase is _Phase.START:
            return self._step_start(final)
        if phase is _Phase.REASONING:
            return self._step_reasoning(final)
        if phase is _Phase.BODY:
            return self._step_body(final)
        if phase is _Phase.JSON:
            return self._step_json(final)
        if phase is _Phase.BLOCK:
            return self._step_block(final)
        if phase is _Phase.MISTRAL:
            return self._step_mistral(final)
        if phase is _Phase.PYTHON:
            return self._step_python(final)
        return False

    def _step_start(self, final: bool) -> bool:
        rest = self._text[self._pos :]
        stripped = rest.lstrip(WHITESPACE)
        if stripped.startswith(self._start_tag):
            self._pos += len(rest) - len(stripped) + len(self._start_tag)
            self._enter_reasoning()
            return True
        if not final and (not stripped or self._start_tag.startswith(stripped)):
            return False
        self._phase = _Phase.BODY
        return True

    def _enter_reasoning(self) -> None:
        self._phase = _Phase.REASONING
        if self._legacy:
            self._emit_content(self._start_tag)

    def _step_reasoning(self, final: bool) -> bool:
        text = self._text
        if not self._thinking:
            while self._pos < len(text) and text[self._pos] in WHITESPACE:
                self._pos += 1
        end = text.find(self._end_tag, self._pos)
        if end >= 0 or final:
            stop = end if end >= 0 else len(text)
            self._emit_thought(text[self._pos : stop].rstrip(WHITESPACE))
            self._pos = stop + len(self._end_tag) if end >= 0 else stop
            if self._legacy:
                self._emit_content(self._end_tag)
            self._phase = _Phase.BODY
            self._skip_ws = True
            return True
        hold = partial_suffix(text, self._pos, (self._end_tag,))
        sure = text[self._pos : len(text) - hold].rstrip(WHITESPACE)
        self._emit_thought(sure)
        self._pos += len(sure)
        return False

    def _step_body(self, final: bool) -> bool:
        text = self._text
        if not self._markers:
            self._emit_body(text[self._pos :])
            self._pos = len(text)
            if final:
                self._emit_content(self._held)
                self._held = ""
                self._phase = _Phase.DONE
            return False
        if self._at_start and self._tools:
            started = self._step_answer_start(final)
            if started is not None:
                return started
        found = min(
            ((text.find(marker, self._pos), marker) for marker in self._markers),
            key=lambda hit: (hit[0] < 0, hit[0]),
        )
        start, marker = found
        if start >= 0 and marker in self._dropped:
            self._emit_body(text[self._pos : start])
            self._pos = start + len(marker)
            return True
        if start >= 0:
            self._emit_body(text[self._pos : start])
            self._open_call(marker, start)
            return True
        hold = 0 if final else partial_suffix(text, self._pos, self._markers)
        self._emit_body(text[self._pos : len(text) - hold])
        self._pos = len(text) - hold
        if final:
            if not self._calls:
                self._emit_content(self._held)
            self._held = ""
            self._phase = _Phase.DONE
        return False

    def _step_answer_start(self, final: bool) -> bool | None:
        """Where a bare JSON call may begin: start scanning one, wait, or (None) go on."""
        text = self._text
        pos = self._pos
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        if not self._skip_ws:
            self._held += text[self._pos : pos]
        self._pos = pos
        if pos == len(text):
            return None if final else False
        self._skip_ws = False
        rest = text[pos : pos + len(MISTRAL_TOOL_CALLS)]
        if MISTRAL_TOOL_CALLS.startswith(rest) and not final and rest != MISTRAL_TOOL_CALLS:
            return False
        if text[pos] in "{[" and rest != MISTRAL_TOOL_CALLS:
            self._scanner = JsonScanner()
            self._scan_from = pos
            self._phase = _Phase.JSON
            return True
        if text[pos] == ";" and self._calls:  # Llama 3.2: `{call}; {call}`
            self._held += ";"
            self._pos += 1
            self._skip_ws = True
            return True
        self._at_start = False
        return None

    def _open_call(self, marker: str, start: int) -> None:
        self._call_start = start
        self._pos = start + len(marker)
        self._at_start = False
        if marker in self._blocks:
            self._block = self._blocks[marker]
            self._phase = _Phase.BLOCK
        elif marker == MISTRAL_TOOL_CALLS:
            self._mistral_step = "begin"
            self._phase = _Phase.MISTRAL
        else:
            self._phase = _Phase.PYTHON

    def _reject_call(self) -> None:
        """The text after a marker is not a call: the marker is content, and reading goes on
        right after it."""
        marker = next(m for m in self._call_markers if self._text.startswith(m, self._call_start))
        self._pos = self._call_start + len(marker)
        self._emit_body(marker)
        self._phase = _Phase.BODY

    def _accept_calls(self, calls: list[ParsedCall], end: int) -> None:
        self._emit_calls(calls)
        self._pos = end
        self._phase = _Phase.BODY

    def _step_block(self, final: bool) -> bool:
        assert self._block is not None
        end_tag, parse = self._block
        end = self._text.find(end_tag, self._pos) if end_tag != TO_THE_END else -1
        if end < 0 and not final:
            return False
        inner = self._text[self._pos : end if end >= 0 else len(self._text)]
        calls = parse(inner, self._types)
        if calls:
            self._accept_calls(calls, end + len(end_tag) if end >= 0 else len(self._text))
        elif end >= 0:
            self._emit_body(self._text[self._call_start : end + len(end_tag)])
            self._pos = end + len(end_tag)
            self._phase = _Phase.BODY
        else:
            self._reject_call()
        return True

    def _step_python(self, final: bool) -> bool:
        if not final:
            return False
        calls = parse_python_tag(self._text[self._pos :])
        if calls:
            self._accept_calls(calls, len(self._text))
        else:
            self._reject_call()
        return True

    def _scan(self) -> tuple[str, bool]:
        """Feed the JSON scanner what arrived; returns (the value's text once complete, failed)."""
        scanner = self._scanner
        assert scanner is not None
        scanner.feed(self._text[self._scan_from + scanner.consumed :])
        if scanner.end is not None:
            return self._text[self._scan_from : self._scan_from + scanner.end], False
        return "", scanner.failed

    def _step_json(self, final: bool) -> bool:
        raw, failed = self._scan()
        if not raw:
            if not (failed or final):
                return False
            self._phase = _Phase.BODY  # not JSON after all: read it again as content
            self._at_start = False
            return True
        end = self._scan_from + len(raw)
        try:
            value = load_json(raw)
        except ValueError:
            value = None
        calls = calls_from_json(value)
        if calls and known_names(calls, self._tool_names):
            self._accept_calls(calls, end)
            self._at_start = True
            return True
        response = generic_response(value)
        self._phase = _Phase.BODY
        self._at_start = False
        self._pos = end
        if response is not None:
            self._held = ""
            self._emit_body(response)
        else:
            self._emit_body(raw)
        return True

    def _step_mistral(self, final: bool) -> bool:
        """`[TOOL_CALLS]` then a JSON array/object, or `name[CALL_ID]id[ARGS]{...}`."""
        text = self._text
        if self._mistral_step == "begin":
            while self._pos < len(text) and text[self._pos] in WHITESPACE:
                self._pos += 1
            if self._pos == len(text):
                if final:
                    self._reject_call()
                return final
            self._scanner = JsonScanner()
            self._scan_from = self._pos
            self._mistral_step = "json" if text[self._pos] in "[{" else "name"
            return True
        if self._mistral_step == "name":
            return self._step_mistral_name(final)
        raw, failed = self._scan()
        if not raw:
            if failed or final:
                self._reject_call()
                return True
            return False
        try:
            value = load_json(raw)
        except ValueError:
            value = None
        if self._mistral_step == "json":
            calls = calls_from_json(value)
        else:
            name, call_id = self._mistral_header
            call = call_from_object({"name": name, "arguments": value, "id": call_id})
            calls = [call] if call else None
        if calls:
            self._accept_calls(calls, self._scan_from + len(raw))
        else:
            self._reject_call()
        return True

    def _step_mistral_name(self, final: bool) -> bool:
        text = self._text
        args = text.find(_MISTRAL_ARGS, self._scan_from)
        if args >= 0:
            header = text[self._scan_from : args]
        else:
            hold = partial_suffix(text, self._scan_from, (_MISTRAL_ARGS, _MISTRAL_CALL_ID))
            header = text[self._scan_from : len(text) - hold]
        name, _, call_id = header.partition(_MISTRAL_CALL_ID)
        valid = all(c.isalnum() or c in "_.-" for c in name + call_id)
        if not valid or len(header) > _MAX_MISTRAL_HEADER or (args < 0 and final):
            self._reject_call()
            return True
        if args < 0:
            return False
        if not name:
            self._reject_call()
            return True
        self._mistral_header = (name, call_id or None)
        self._scanner = JsonScanner()
        self._scan_from = args + len(_MISTRAL_ARGS)
        self._mistral_step = "args"
        return True
