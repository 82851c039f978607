"""Blocks of several calls read while they are still open, so that each call streams as
llama-server streams it (its id and name once known, then its arguments in pieces): the
families llama.cpp reads with its auto-parser whose calls are listed in one block —
Nemotron-Nano-v2's `<TOOLCALL>[{"name", "arguments"}, …]</TOOLCALL>` and Apriel's
`<tool_calls>[…]</tool_calls>` (JSON lists of calls), Apertus's `[{"NAME": {arguments}}, …]`,
MiniMax-M2's `<invoke name="NAME"><parameter name="K">V</parameter>…</invoke>` in
`<minimax:tool_call>`. Each reader gives every call begun so far, those before the last whole
(streamed_calls.py `BlockPartials`), up to the first whose name is not complete; the certain
arguments are a prefix of the compact JSON the whole block's parser gives."""

from __future__ import annotations

import json
from typing import Any

from api.chat.partial_calls import load_partial_json, partial_call
from api.chat.tagged_calls import (
    _MINIMAX_INVOKE,
    _MINIMAX_PARAM,
    ParamTypes,
    _typed_arguments,
)
from api.chat.tool_formats import (
    WHITESPACE,
    ParsedCall,
    call_from_object,
    calls_from_json_text,
    dump_arguments,
)

Partial = tuple[str, str, str, "str | None"]
_DECODER = json.JSONDecoder(strict=False)


def parse_listed_calls(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """A JSON list (or object) of `{"name", "arguments"}` calls, in a block with an end tag
    (streamed as written, unlike the same JSON running to the end of the answer)."""
    return calls_from_json_text(inner)


def list_items(inner: str) -> tuple[list[Any], str]:
    """The whole items of a JSON list begun in `inner`, and the text of the one being written
    ("" when none is)."""
    text = inner.lstrip(WHITESPACE)
    if not text.startswith("["):
        return [], text
    items: list[Any] = []
    pos = 1
    while True:
        while pos < len(text) and text[pos] in WHITESPACE + ",":
            pos += 1
        if pos == len(text) or text[pos] == "]":
            return items, ""
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return items, text[pos:]
        items.append(value)


def _whole(name: str, arguments: object) -> Partial | None:
    if not name or not isinstance(arguments, dict):
        return None
    dumped = dump_arguments(arguments)
    return name, dumped, dumped, None


def listed_json(inner: str, _types: ParamTypes) -> list[Partial]:
    """`[{"name": N, "arguments": {…}}, …`: each call once its name is complete."""
    items, open_item = list_items(inner)
    found: list[Partial] = []
    for item in items:
        call = call_from_object(item)
        if call is None:
            return found
        found.append((call.name, call.arguments, call.arguments, call.id))
    begun = partial_call(open_item) if open_item else None
    return [*found, (*begun, None)] if begun else found


def listed_apertus(inner: str, _types: ParamTypes) -> list[Partial]:
    """Apertus `[{"NAME": {…}}, …`: each call once its name's key is complete."""
    items, open_item = list_items(inner)
    found: list[Partial] = []
    for item in items:
        call = _whole(*next(iter(item.items()))) if isinstance(item, dict) and \
            len(item) == 1 else None
        if call is None:
            return found
        found.append(call)
    loaded = load_partial_json(open_item) if open_item else None
    if loaded is None or not isinstance(loaded[0], dict) or len(loaded[0]) != 1:
        return found
    value, _, added = loaded
    ((name, arguments),) = value.items()
    if not isinstance(arguments, dict):  # the key still being written, or no object yet
        return found
    dumped = dump_arguments(arguments)
    open_in_args = max(added - 1, 0)
    return [*found, (name, dumped[:len(dumped) - open_in_args], dumped, None)]


_INVOKE_OPEN = '<invoke name="'


def listed_minimax(inner: str, types: ParamTypes) -> list[Partial]:
    """MiniMax-M2's invokes: each once its name's tag is written, its parameters as each
    closes, the object closed at `</invoke>`."""
    found: list[Partial] = []
    pos = 0
    for match in _MINIMAX_INVOKE.finditer(inner):
        if inner[pos:match.start()].strip(WHITESPACE):
            return found
        name = match.group(1).strip(WHITESPACE)
        arguments = _typed_arguments(name, _MINIMAX_PARAM.findall(match.group(2)), types)
        found.append((name, arguments, arguments, None))
        pos = match.end()
    rest = inner[pos:].lstrip(WHITESPACE)
    if not rest.startswith(_INVOKE_OPEN):
        return found
    name, sep, body = rest[len(_INVOKE_OPEN):].partition('">')
    if not sep:
        return found
    name = name.strip(WHITESPACE)
    pairs, at = [], 0
    for param in _MINIMAX_PARAM.finditer(body):
        if body[at:param.start()].strip(WHITESPACE):
            break
        pairs.append((param.group(1), param.group(2)))
        at = param.end()
    arguments = _typed_arguments(name, pairs, types)
    return [*found, (name, arguments[:-1], arguments, None)]
