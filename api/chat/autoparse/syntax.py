"""A tool-call reader built from a template's analysis (what llama.cpp's
common/chat-auto-parser-generator.cpp builds as a PEG parser): the block a call section opens
and closes, and how the calls in it are read — a JSON object of `name`/`arguments` fields
(JSON_NATIVE), a tagged name with JSON arguments (TAG_WITH_JSON) or with tagged arguments
(TAG_WITH_TAGGED). String parameters are read as text up to the value's closing marker; the
others as JSON (text where it does not read as JSON), as llama.cpp reads them."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from api.chat.autoparse.analysis import analyze
from api.chat.autoparse.diff import WHITESPACE, trim
from api.chat.autoparse.model import Analysis
from api.chat.autoparse.tool_analysis import ToolAnalysis
from api.chat.tagged_calls import ParamTypes, typed_value
from api.chat.tool_formats import ParsedCall, dump_arguments

BlockReader = Callable[[str, ParamTypes], "list[ParsedCall] | None"]
_NAME = re.compile(r"[\w.\-:]+")
_GENERIC_STARTS = frozenset({"<tool_call>", "<function=", "[TOOL_CALLS]", "<|python_tag|>",
                             "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"})
"""Call markers the generic reader (parsing.py) already reads: a template whose calls start
with one of them keeps that reader, unless its calls are tagged rather than JSON."""
DEFAULT_REASONING = ("<think>", "</think>")


@dataclass(frozen=True)
class AutoSyntax:
    start: str
    """The marker that opens the calls ("" when the template has no tool calls to read)."""
    end: str
    """The marker that closes them ("" : they run to the end of the answer)."""
    read: BlockReader | None
    dropped: tuple[str, ...]
    """Content wrappers (`<|content|>` … `<|end|>`), not content."""
    reasoning: tuple[str, str] | None
    """The thinking tags, where they are not `<think>`/`</think>`."""
    markers: tuple[str, ...]
    """Every marker found, for preserved_tokens."""


def _get(value: Any, path: str) -> Any:
    for key in path.split(".") if path else ():
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _json_values(text: str) -> list[Any] | None:
    decoder = json.JSONDecoder(strict=False)
    values, pos = [], 0
    text = text.strip(WHITESPACE)
    while pos < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        values += value if isinstance(value, list) else [value]
        while pos < len(text) and text[pos] in WHITESPACE + ",;":
            pos += 1
    return values


def _json_native(t: ToolAnalysis) -> BlockReader:
    name_field, args_field = t.name_field, t.args_field
    if t.function_field and t.function_field != "function" and "." not in name_field:
        name_field = f"{t.function_field}.{name_field}"
        args_field = f"{t.function_field}.{args_field}"

    def read(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
        end = trim(t.per_call_end)
        pieces = [inner]
        if t.per_call_start and t.section_start:
            pieces = [p.strip(WHITESPACE).removesuffix(end) for p in
                      inner.split(trim(t.per_call_start))[1:]]
        calls: list[ParsedCall] = []
        for piece in pieces:
            values = _json_values(piece)
            if not values:
                return None
            for value in values:
                if not isinstance(value, dict):
                    return None
                if t.fun_name_is_key:
                    if len(value) != 1:
                        return None
                    ((name, arguments),) = value.items()
                    ident = None
                else:
                    name, arguments = _get(value, name_field), _get(value, args_field)
                    ident = _get(value, t.id_field) if t.id_field else None
                if not isinstance(name, str) or not name:
                    return None
                if arguments is None:
                    arguments = {}
                text = arguments if isinstance(arguments, str) else dump_arguments(arguments)
                calls.append(ParsedCall(name=name, arguments=text,
                                        id=ident if isinstance(ident, str) else None))
        return calls
    return read


def _after(text: str, marker: str) -> str | None:
    """`text` after `marker` (leading whitespace of both ignored); None where it is not there."""
    text, marker = text.lstrip(WHITESPACE), marker.lstrip(WHITESPACE)
    return text[len(marker):] if text.startswith(marker) else None


def _skip(text: str, marker: str) -> str:
    """`text` after `marker` where it starts with it, else `text`."""
    after = _after(text, marker)
    return text if after is None else after


def _tagged_arguments(t: ToolAnalysis, body: str, known: dict[str, Any]) -> str | None:
    """`<name prefix>KEY<name suffix><value prefix>VALUE<value suffix>…`; the text after the
    last value (the call's close) must be all that is left."""
    name_prefix, name_suffix = trim(t.arg_name_prefix), trim(t.arg_name_suffix)
    value_prefix = trim(t.arg_value_prefix)
    value_suffix = t.arg_value_suffix.rstrip(WHITESPACE)
    arguments: dict[str, Any] = {}
    rest = body
    while (after := _after(rest, name_prefix)) is not None:
        key, sep, rest = after.partition(name_suffix) if name_suffix else ("", "", after)
        if not sep:
            return None
        if value_prefix:
            rest = _skip(rest, value_prefix)
        end = rest.find(value_suffix)
        closer = value_suffix
        if end < 0:
            closer = value_suffix.lstrip(WHITESPACE)
            end = rest.find(closer)
        if end < 0:
            return None
        raw = rest[:end]
        if name_suffix and t.arg_name_suffix.endswith("\n") and raw.startswith("\n"):
            raw = raw[1:]
        key = key.strip(WHITESPACE)
        arguments[key] = typed_value(raw, known.get(key))
        rest = rest[end + len(closer):]
        if t.arg_separator:
            rest = _skip(rest, t.arg_separator)
    for closer in (trim(t.args_end), trim(t.close)):
        if closer:
            rest = _skip(rest, closer)
    return dump_arguments(arguments) if not rest.strip(WHITESPACE) else None


def call_name(t: ToolAnalysis, text: str, written: bool) -> tuple[str, str] | None:
    """(the name of the call `text` begins with, from its name's prefix on; what follows it),
    or None where no name is there. `written`: `text` is the whole answer; otherwise it is
    still being written, and a name that runs to its end may still grow."""
    rest = _after(text, t.name_prefix) if trim(t.name_prefix) else text.lstrip(WHITESPACE)
    if rest is None:
        return None
    suffix = trim(t.name_suffix)
    if suffix:
        name, sep, rest = rest.partition(suffix)
        if not sep:
            return None
    else:
        found = _NAME.match(rest)
        if found is None or (not written and found.end() == len(rest)):
            return None
        name, rest = found.group(0), rest[found.end():]
    name = name.strip(WHITESPACE)
    if not _NAME.fullmatch(name):
        return None
    return name, rest


def _one_tagged_call(t: ToolAnalysis, text: str, types: ParamTypes) -> ParsedCall | None:
    named = call_name(t, text, written=True)
    if named is None:
        return None
    name, rest = named
    if t.args_separator:
        rest = _skip(rest, t.args_separator)
    ident = None
    if _has_call_id(t):
        with_id = _call_id(t, rest)
        if with_id is None:
            return None
        ident, rest = with_id
    if t.mode == "TAG_WITH_TAGGED":
        arguments = _tagged_arguments(t, rest, dict(types.get(name, {})))
    else:
        arguments = _json_arguments(t, rest)
    if arguments is None:
        return None
    return ParsedCall(name=name, arguments=arguments, id=ident or None)


def _has_call_id(t: ToolAnalysis) -> bool:
    """llama.cpp's generator reads an id only between the name and the arguments, where a
    marker opens it and one closes it (or the arguments' own opener does)."""
    return t.call_id_pos == "BETWEEN_FUNC_AND_ARGS" and bool(trim(t.call_id_prefix)) and \
        bool(trim(t.call_id_suffix) or trim(t.args_start))


def _call_id(t: ToolAnalysis, rest: str) -> tuple[str, str] | None:
    """(the call's id, what follows it); the id is optional, the marker after it is not where
    the calls' arguments are JSON (llama.cpp's generator: `[CALL_ID]id` optional, `[ARGS]`
    required). None: not a call."""
    prefix, suffix = trim(t.call_id_prefix), trim(t.call_id_suffix)
    closer = suffix or trim(t.args_start)
    ident = ""
    after = _after(rest, prefix)
    if after is not None and closer in after:
        ident, _, rest = after.partition(closer)
        rest = closer + rest
    elif after is not None:
        return None
    if suffix:
        after = _after(rest, suffix)
        if after is None:
            return (ident, rest) if t.mode == "TAG_WITH_TAGGED" and not ident else None
        rest = after
    return ident, rest


def _json_arguments(t: ToolAnalysis, rest: str) -> str | None:
    if trim(t.args_start):
        after = _after(rest, trim(t.args_start))
        if after is None:
            return None
        rest = after
    rest = rest.lstrip(WHITESPACE)
    try:
        value, end = json.JSONDecoder(strict=False).raw_decode(rest)
    except ValueError:
        return None
    rest = rest[end:]
    for closer in (trim(t.args_end), trim(t.close)):
        if closer:
            rest = _skip(rest, closer)
    if rest.strip(WHITESPACE) or not isinstance(value, dict):
        return None
    return dump_arguments(value)


def _tagged(t: ToolAnalysis) -> BlockReader:
    per_call, call_end = trim(t.per_call_start), trim(t.per_call_end)
    name_prefix = trim(t.name_prefix)

    def read(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
        if per_call and t.section_start:
            head, *pieces = inner.split(per_call)
        elif per_call and not call_end and per_call in inner:  # calls run to the next one
            head, pieces = "", inner.split(per_call)
        elif name_prefix and not per_call:
            head, *pieces = inner.split(name_prefix)
            pieces = [name_prefix + p for p in pieces]
        else:
            head, pieces = "", [inner]
        if head.strip(WHITESPACE) or not pieces:
            return None
        calls = []
        for piece in pieces:
            piece = piece.rstrip(WHITESPACE)
            if call_end:
                piece = piece.removesuffix(call_end)
            call = _one_tagged_call(t, piece, types)
            if call is None:
                return None
            calls.append(call)
        return calls
    return read


def _markers(a: Analysis) -> tuple[str, ...]:
    t = a.tools
    found = (a.reasoning.start, a.reasoning.end, a.content.start, a.content.end,
             t.section_start, t.section_end, t.per_call_start, t.per_call_end, t.name_prefix,
             t.name_suffix, t.args_separator, t.close, t.args_start, t.args_end,
             t.arg_name_prefix, t.arg_name_suffix, t.arg_separator, t.arg_value_prefix,
             t.arg_value_suffix, t.call_id_prefix, t.call_id_suffix)
    return tuple(dict.fromkeys(trim(m) for m in found if trim(m)))


def _block(t: ToolAnalysis) -> tuple[str, str, BlockReader | None]:
    """(start marker, end marker, reader) of the calls; ("", "", None) when none is usable."""
    if t.mode == "NONE":
        return "", "", None
    if trim(t.section_start):
        start, end = trim(t.section_start), trim(t.section_end)
    elif trim(t.per_call_start):
        start, end = trim(t.per_call_start), trim(t.per_call_end) or trim(t.close)
    else:
        start, end = trim(t.name_prefix), trim(t.close)
    if not start:
        return "", "", None
    if t.mode == "JSON_NATIVE":
        if start in _GENERIC_STARTS:
            return "", "", None
        return start, end, _json_native(t)
    if t.mode == "TAG_WITH_TAGGED" and not trim(t.arg_name_prefix):
        return "", "", None
    if start in _GENERIC_STARTS and t.mode == "TAG_WITH_JSON":
        return "", "", None
    if not trim(t.per_call_start) and trim(t.section_start) and not trim(t.name_prefix):
        return "", "", None
    return start, end, _tagged(t)


@functools.lru_cache(maxsize=32)
def auto_syntax(source: str) -> AutoSyntax | None:
    """What the analysis of a template adds to the generic reader (None: nothing)."""
    try:
        a = analyze(source)
    except Exception:  # a template the analysis cannot render is read as before
        return None
    start, end, read = _block(a.tools)
    reasoning = None
    tags = (trim(a.reasoning.start), trim(a.reasoning.end))
    if a.reasoning.mode != "NONE" and all(tags) and tags != DEFAULT_REASONING:
        reasoning = tags
    dropped: tuple[str, ...] = ()
    if a.content.mode == "ALWAYS_WRAPPED" and trim(a.content.start) and trim(a.content.end):
        dropped = (trim(a.content.start), trim(a.content.end))
    if not (read or reasoning or dropped):
        return None
    return AutoSyntax(start=start, end=end, read=read, dropped=dropped, reasoning=reasoning,
                      markers=_markers(a))
