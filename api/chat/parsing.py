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
(chat_formats.py, tagged_calls.py; gpt-oss and Functionary v3.2: harmony.py, functionary.py). A
bare JSON call is recognised only at the start of the answer (or right after another bare call);
tagged formats anywhere. Text that looks like a call but does not parse stays content; a call cut
short by the end of the output is read as llama.cpp reads it (`_cut_short`). Calls get
llama-server's random 32-character ids unless the model wrote one.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from api.chat.chat_formats import GENERIC, GENERIC_BLOCKS, TO_THE_END, BlockParser, ChatFormat
from api.chat.deltas import Deltas
from api.chat.message import ChatDelta, ChatMessage
from api.chat.mistral_calls import MistralCalls
from api.chat.partial_calls import cut_short_calls
from api.chat.reasoning_tags import check_reasoning_format, reasoning_tags
from api.chat.streamed_calls import DROPPED_WHEN_BROKEN, STREAMED, cut_block_calls, kept_call
from api.chat.tagged_calls import ParamTypes
from api.chat.tool_formats import (
    WHITESPACE,
    JsonScanner,
    ParsedCall,
    calls_from_json,
    generic_response,
    known_names,
    load_json,
    may_grow,
    parse_python_tag,
    partial_suffix,
)

MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"


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
        self._emit = Deltas(legacy=reasoning_format == "deepseek-legacy",
                            parallel=parallel_tool_calls)
        self._tools = tools
        self._types: ParamTypes = param_types or {}
        self._blocks = {**GENERIC_BLOCKS, **chat_format.blocks}
        self._streamed = {**STREAMED, **chat_format.streamed}
        self._dropped = (*chat_format.dropped,
                         *(chat_format.dropped_reasoning if reasoning else ()))
        self._call_markers = (*self._blocks, MISTRAL_TOOL_CALLS, PYTHON_TAG) if tools else ()
        self._markers = (*self._call_markers, *self._dropped)
        self._tool_names = frozenset(tool_names) if tool_names is not None else None
        self._start_tag, self._end_tag = chat_format.reasoning or reasoning_tags(template_source)
        self._reasoning_ends = chat_format.reasoning_ends
        self._text = ""
        self._pos = 0
        self._phase = _Phase.START if reasoning else _Phase.BODY
        self._at_start = True  # a bare JSON call may begin here
        self._call_start = 0  # where the current call block's marker starts
        self._block: tuple[str, BlockParser] | None = None
        self._scanner: JsonScanner | None = None
        self._scan_from = 0
        self._mistral: MistralCalls | None = None
        self._steps = {_Phase.START: self._step_start, _Phase.REASONING: self._step_reasoning,
                       _Phase.BODY: self._step_body, _Phase.JSON: self._step_json,
                       _Phase.BLOCK: self._step_block, _Phase.MISTRAL: self._step_mistral,
                       _Phase.PYTHON: self._step_python}
        if reasoning and thinking_forced_open:
            self._enter_reasoning()
        elif thinking_forced_open and chat_format.echo_opened:
            self._emit.body(opened or self._start_tag)
            self._at_start = False
        elif thinking_forced_open:
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
        return self._emit.take()

    def flush(self) -> list[ChatDelta]:
        """End of generation: decide everything held back; returns the last deltas."""
        while self._phase is not _Phase.DONE:
            self._step(final=True)
        return self._emit.take()

    def finish(self) -> ChatMessage:
        """The whole message (ends the stream first if `flush()` was not called)."""
        self.flush()
        return self._emit.message()

    def _compact(self) -> None:
        """Forget text already consumed, where no phase looks back at it."""
        if self._pos > 4096 and self._phase in (_Phase.BODY, _Phase.REASONING, _Phase.START):
            self._text = self._text[self._pos :]
            self._pos = 0

    # the state machine: each step returns whether it made progress

    def _step(self, *, final: bool) -> bool:
        step = self._steps.get(self._phase)
        return step(final) if step is not None else False

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
        if self._emit.legacy:
            self._emit.content(self._start_tag)

    def _step_reasoning(self, final: bool) -> bool:
        text = self._text
        if not self._emit.thinking:
            while self._pos < len(text) and text[self._pos] in WHITESPACE:
                self._pos += 1
        end, end_tag = min(
            ((text.find(tag, self._pos), tag) for tag in (self._end_tag, *self._reasoning_ends)),
            key=lambda hit: (hit[0] < 0, hit[0]))
        if end >= 0 or final:  # at the end: a call marker cut short is dropped (Ling 3)
            stop = end if end >= 0 else len(text) - partial_suffix(
                text, self._pos, self._reasoning_ends if self._tools else ())
            self._emit.thought(text[self._pos : stop].rstrip(WHITESPACE))
            closed = end >= 0 and end_tag == self._end_tag
            self._pos = stop + len(self._end_tag) if closed else stop
            if self._emit.legacy and closed:
                self._emit.content(self._end_tag)
            self._phase = _Phase.BODY
            self._emit.skip_ws = True
            return True
        hold = partial_suffix(text, self._pos, (self._end_tag, *self._reasoning_ends))
        sure = text[self._pos : len(text) - hold].rstrip(WHITESPACE)
        self._emit.thought(sure)
        self._pos += len(sure)
        return False

    def _step_body(self, final: bool) -> bool:
        text = self._text
        if not self._markers:
            self._emit.body(text[self._pos :])
            self._pos = len(text)
            if final:
                self._emit.content(self._emit.held)
                self._emit.held = ""
                self._phase = _Phase.DONE
            return False
        if self._at_start and self._tools:
            started = self._step_answer_start(final)
            if started is not None:
                return started
        found = min(  # the first marker; of two at one place, the longer
            ((text.find(marker, self._pos), marker) for marker in self._markers),
            key=lambda hit: (hit[0] < 0, hit[0], -len(hit[1])),
        )
        start, marker = found
        if start >= 0 and not final and may_grow(text, start, marker, self._markers):
            self._emit.body(text[self._pos : start])  # a longer marker may be coming
            self._pos = start
            return False
        if start >= 0 and marker in self._dropped:
            self._emit.body(text[self._pos : start])
            self._pos = start + len(marker)
            return True
        if start >= 0:
            self._emit.body(text[self._pos : start])
            self._open_call(marker, start)
            return True
        hold = partial_suffix(text, self._pos, self._markers)
        self._emit.body(text[self._pos : len(text) - hold])  # final: a marker cut short goes
        self._pos = len(text) - hold
        if final:
            if not self._emit.tool_calls:
                self._emit.content(self._emit.held)
            self._emit.held = ""
            self._phase = _Phase.DONE
        return False

    def _step_answer_start(self, final: bool) -> bool | None:
        """Where a bare JSON call may begin: start scanning one, wait, or (None) go on."""
        text = self._text
        pos = self._pos
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        if not self._emit.skip_ws:
            self._emit.held += text[self._pos : pos]
        self._pos = pos
        if pos == len(text):
            return None if final else False
        self._emit.skip_ws = False
        rest = text[pos : pos + len(MISTRAL_TOOL_CALLS)]
        if MISTRAL_TOOL_CALLS.startswith(rest) and not final and rest != MISTRAL_TOOL_CALLS:
            return False
        if text[pos] in "{[" and rest != MISTRAL_TOOL_CALLS:
            self._scanner = JsonScanner()
            self._scan_from = pos
            self._phase = _Phase.JSON
            return True
        if text[pos] == ";" and self._emit.tool_calls:  # Llama 3.2: `{call}; {call}`
            self._emit.held += ";"
            self._pos += 1
            self._emit.skip_ws = True
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
            self._mistral = MistralCalls(self._pos)
            self._phase = _Phase.MISTRAL
        else:
            self._phase = _Phase.PYTHON

    def _reject_call(self) -> None:
        """The text after a marker is not a call: the marker is content, and reading goes on
        right after it."""
        marker = next(m for m in self._call_markers if self._text.startswith(m, self._call_start))
        self._pos = self._call_start + len(marker)
        self._emit.body(marker)
        self._phase = _Phase.BODY

    def _accept_calls(self, calls: list[ParsedCall], end: int) -> None:
        self._emit.calls(calls)
        self._pos = end
        self._phase = _Phase.BODY

    def _step_block(self, final: bool) -> bool:
        assert self._block is not None
        end_tag, parse = self._block
        end = self._text.find(end_tag, self._pos) if end_tag != TO_THE_END else -1
        if end < 0 and not final:
            if (reader := self._streamed.get(parse)) is not None:  # streamed as written
                self._emit.stream_call(reader(self._text[self._pos :], self._types))
            return False
        inner = self._text[self._pos : end if end >= 0 else len(self._text)]
        if end < 0 and end_tag != TO_THE_END:
            self._cut_short(inner, end_tag, parse)
            return True
        calls = parse(inner, self._types)
        if not calls and parse in self._streamed:  # a named call cut short is kept
            calls = kept_call(self._streamed[parse], inner, self._types, closed=end >= 0)
        if calls or self._emit.streaming is not None:
            self._accept_calls(calls or [], end + len(end_tag) if end >= 0 else len(self._text))
        elif end >= 0 and parse in DROPPED_WHEN_BROKEN:
            self._accept_calls([], end + len(end_tag))
        elif end >= 0:
            self._emit.body(self._text[self._call_start : end + len(end_tag)])
            self._pos = end + len(end_tag)
            self._phase = _Phase.BODY
        elif (cut := cut_short_calls(inner)) is not None:  # JSON calls to the end, cut short
            self._accept_calls(cut, len(self._text))
        elif inner.lstrip(WHITESPACE)[:1] in ("{", "["):  # broken JSON calls to the end:
            self._accept_calls([], len(self._text))  # dropped, as llama.cpp's parse drops them
        else:
            self._reject_call()
        return True

    def _cut_short(self, inner: str, end_tag: str, parse: BlockParser) -> None:
        """The output ends in a call block (`max_tokens`): as llama.cpp's lenient parse, the
        calls written whole (a half end tag aside), else the call once named, its arguments as
        far as they go (unclosed JSON), else nothing; never content (test_chat_malformed.py)."""
        inner = inner[: len(inner) - partial_suffix(inner, 0, (end_tag,))]
        calls, guess = cut_block_calls(inner, parse, self._types, self._streamed.get(parse))
        self._emit.guess = guess if guess is not None else self._emit.guess
        self._accept_calls(calls, len(self._text))

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
            self._emit.held = ""
            self._emit.body(response)
        else:
            self._emit.body(raw)
        return True

    def _step_mistral(self, final: bool) -> bool:
        assert self._mistral is not None
        read = self._mistral.read(self._text, final)
        if read is None:
            return False
        calls, end = read
        if not calls and self._mistral.arguments_broken:  # dropped with the rest of the
            if not final:  # answer, as llama.cpp's lenient parse drops them
                return False
            self._accept_calls([], len(self._text))
            return True
        cut = self._mistral.cut_short(self._text) if final and not calls else None
        if calls or cut is not None:
            self._accept_calls(calls or cut or [], end if calls else len(self._text))
        else:
            self._reject_call()
        return True
