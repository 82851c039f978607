"""A tool call streamed while it is written (as llama-server streams one): its id and name as
soon as the name is complete, then its arguments in pieces, each piece certain to be part of
the final arguments (the compact JSON text the whole answer gives).

Read from a call block that is still open (`<tool_call>{"name": …, "arguments": {…` so far):
the partial JSON is closed (a trailing unfinished number, literal, key or escape left out),
read, and its arguments dumped compactly; what the dump has past the closers added is certain.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from api.chat.tagged_calls import ParamTypes, typed_value
from api.chat.tool_formats import WHITESPACE, ParsedCall, dump_arguments, partial_suffix

_SCALAR_END = frozenset(",:]}" + WHITESPACE)


def close_partial_json(text: str) -> tuple[str, int] | None:
    """(`text` cut to its last point that can be closed and closed there, how many closing
    characters were added), or None when it is not the start of one JSON object. A key, a
    number or a literal counts only once complete; a string value counts up to its last
    complete character."""
    if not text.lstrip(WHITESPACE).startswith("{"):
        return None
    stack: list[str] = []  # "{" or "["
    expect: list[str] = []  # per object: "key", "colon", "value", "comma"
    cut, cut_stack, cut_in_string = 0, "", False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in WHITESPACE:
            i += 1
            continue
        state = expect[-1] if expect else "value"
        if ch == '"':
            j, complete, last_char = _string_end(text, i)
            if state == "key":
                if not complete:
                    break
                expect[-1] = "colon"
            elif state == "value":
                if not complete:
                    cut, cut_stack, cut_in_string = last_char, "".join(stack), True
                    break
                _after_value(expect)
                cut, cut_stack, cut_in_string = j, "".join(stack), False
            else:
                return None
            i = j
            continue
        if ch in "{[" and state == "value":
            _after_value(expect)
            stack.append(ch)
            expect.append("key" if ch == "{" else "value")
            if ch == "[":
                expect[-1] = "value"
            cut, cut_stack, cut_in_string = i + 1, "".join(stack), False
        elif ch in "}]" and stack and stack[-1] == ("{" if ch == "}" else "["):
            stack.pop()
            expect.pop()
            cut, cut_stack, cut_in_string = i + 1, "".join(stack), False
        elif ch == ":" and state == "colon":
            expect[-1] = "value"
        elif ch == "," and state == "comma":
            expect[-1] = "key" if stack[-1] == "{" else "value"
        elif state == "value" and ch not in ",:}]":
            j = i
            while j < len(text) and text[j] not in _SCALAR_END:
                j += 1
            if j == len(text):
                break
            _after_value(expect)
            cut, cut_stack, cut_in_string = j, "".join(stack), False
            i = j
            continue
        else:
            return None
        i += 1
    closing = ('"' if cut_in_string else "") + "".join(
        "}" if c == "{" else "]" for c in reversed(cut_stack))
    return text[:cut] + closing, len(closing)


def _after_value(expect: list[str]) -> None:
    if expect:
        expect[-1] = "comma"


def _string_end(text: str, quote: int) -> tuple[int, bool, int]:
    """(where the string opening at `quote` ends, whether it is complete, the end of its last
    complete character: an escape cut in half is not one)."""
    i = quote + 1
    last = i
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return i + 1, True, i
        if ch == "\\":
            size = 6 if text[i + 1:i + 2] == "u" else 2
            if i + size > len(text):
                return len(text), False, last
            i += size
        else:
            i += 1
        last = i
    return len(text), False, last


@dataclass
class StreamedCall:
    """A call being streamed: its index among the answer's calls and the arguments sent."""

    index: int
    name: str
    sent: str = ""


def load_partial_json(text: str) -> tuple[Any, str, int] | None:
    """The JSON object begun in `text` read as far as it can be closed: (its value, the closed
    text, how many closing characters were added), or None."""
    closed = close_partial_json(text)
    if closed is None:
        return None
    cut, added = closed
    try:
        return json.loads(cut, strict=False), cut, added
    except ValueError:
        return None


def partial_arguments(text: str) -> tuple[str, str] | None:
    """(certain, guessed) compact arguments of a JSON object still being written."""
    loaded = load_partial_json(text)
    if loaded is None or not isinstance(loaded[0], dict):
        return None
    dumped = dump_arguments(loaded[0])
    added = loaded[2]
    return (dumped[:len(dumped) - added] if added else dumped), dumped


def cut_short_calls(text: str) -> list[ParsedCall] | None:
    """A JSON call `{"name", "arguments"}` (or a list of them) cut short by the end of the
    output, as llama.cpp's lenient parse keeps it: [the call] once named (its arguments as far
    as they are certain), [] before; None where the text is not the start of such a call."""
    body = text.lstrip(WHITESPACE).removeprefix("[").lstrip(WHITESPACE)
    if not body:
        return []
    if close_partial_json(body) is None:
        return None
    found = partial_call(body)
    return [ParsedCall(found[0], found[1])] if found else []


def partial_call(inner: str) -> tuple[str, str, str] | None:
    """(name, the arguments text certain so far, the arguments as they would be if the call
    ended here) of a JSON call `{"name", "arguments"}` still being written, or None while its
    name is not complete."""
    loaded = load_partial_json(inner)
    if loaded is None:
        return None
    value, text, added = loaded
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    keys = list(value)
    if not isinstance(name, str) or not name:
        return None
    open_string = added > 0 and text[-added] == '"'
    if keys[-1] == "name" and open_string:
        return None  # the name may still grow
    if "arguments" not in value:
        return name, "", "{}"  # named: llama.cpp has the call from here on
    if not isinstance(value["arguments"], dict):
        return None  # arguments must be an object
    arguments = value["arguments"]
    dumped = dump_arguments(arguments)
    args_last = keys[-1] == "arguments"
    if not args_last:
        return name, dumped, dumped  # the arguments are complete
    # what the closers added is at the dump's end, as many characters as were added, less
    # those that closed the call object itself
    open_in_args = max(added - 1, 0)
    certain = dumped[:len(dumped) - open_in_args] if open_in_args else dumped
    return name, certain, dumped


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER, _PARAMETER_END = "<parameter=", "</parameter>"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def partial_xml_call(inner: str, types: ParamTypes) -> tuple[str, str, str] | None:
    """The same for Qwen3-Coder's XML (`<function=NAME><parameter=K>V</parameter>…`): the
    parameters complete so far, then a string parameter's text as it is written (less what may
    still be markup: a trailing newline, a piece of `</parameter>`)."""
    match = _XML_FUNCTION.match(inner)
    if match is None:
        return None
    name = match.group(1).strip(WHITESPACE)
    body = inner[match.end():]
    done = body.find("</function>")
    body = body if done < 0 else body[:done]
    known = types.get(name, {})
    pairs: dict[str, Any] = {}
    open_value = ""
    pos = 0
    while (start := body.find(_PARAMETER, pos)) >= 0:
        key_end = body.find(">", start)
        if key_end < 0:
            break
        key = body[start + len(_PARAMETER):key_end].strip(WHITESPACE)
        close = body.find(_PARAMETER_END, key_end)
        if close < 0:
            if known.get(key) == "string":
                raw = body[key_end + 1:]
                raw = raw[:len(raw) - partial_suffix(raw, 0, (_PARAMETER_END,))]
                if raw.startswith("\n"):
                    raw = raw[1:].removesuffix("\n")
                elif not raw:
                    raw = ""
                open_value = f"{_compact(key)}:{_compact(raw)[:-1]}"
            break
        pairs[key] = typed_value(body[key_end + 1:close], known.get(key))
        pos = close + len(_PARAMETER_END)
    whole = dump_arguments(pairs)
    if done >= 0:
        return name, whole, whole
    certain = whole[:-1] + ("," if pairs and open_value else "") + open_value
    guess = certain + ('"}' if open_value else "}")
    return name, certain, guess


def partial_tool_call(inner: str, types: ParamTypes) -> tuple[str, str, str] | None:
    """A call being written in a `<tool_call>` block: JSON or Qwen3-Coder's XML."""
    if inner.lstrip(WHITESPACE).startswith("<function="):
        return partial_xml_call(inner, types)
    return partial_call(inner)
