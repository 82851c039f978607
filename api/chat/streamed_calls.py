"""The call blocks whose calls are streamed while they are written (as llama-server streams
them: the call's id and name once known, then its arguments in pieces), and how a block still
open is read: JSON `{"name", "arguments"}` or Qwen3-Coder's XML in `<tool_call>` (and
Seed-OSS's), LFM2's pythonic calls (pythonic_calls.py), Command-R7B's / Cohere2-MoE's JSON
actions, Kimi-K2's calls. Each reader gives (name, the arguments certain so far, the arguments
guessed whole, the call's id where the format writes one), or None while the name is not
complete."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from api.chat.family_calls import (
    _ATEM_PARAM,
    _CPM_PARAM,
    _DSML_PARAM,
    DSML,
    dsml_arguments,
    parse_apertus_calls,
    parse_dsml_calls,
    parse_gemma4_call,
    parse_json_calls,
    parse_kimi_k3_tools,
    parse_minicpm5_call,
    parse_muse_call,
    parse_pythonic_calls,
)
from api.chat.listed_calls import (
    list_items,
    listed_apertus,
    listed_json,
    listed_minimax,
    parse_listed_calls,
)
from api.chat.partial_calls import (
    cut_short_calls,
    load_partial_json,
    partial_arguments,
    partial_tool_call,
    partial_xml_call,
)
from api.chat.pythonic_calls import pythonic_calls
from api.chat.tagged_calls import (
    _GLM_ARG,
    _KIMI_ID,
    _NAME,
    KIMI_ARGS_BEGIN,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    ParamTypes,
    _typed_arguments,
    parse_command_r_action,
    parse_glm_tool_call,
    parse_kimi_call,
    parse_kimi_section,
    parse_minimax_calls,
    parse_tool_call_block,
    parse_xml_calls,
    typed_value,
)
from api.chat.tool_formats import WHITESPACE, ParsedCall, call_from_object, dump_arguments

Partial = tuple[str, str, str, "str | None"]
PartialReader = Callable[[str, ParamTypes], "Partial | None"]
BlockPartials = Callable[[str, ParamTypes], "Partial | list[Partial] | None"]
"""A reader of the block's first call (PartialReader) or of each call begun so far (the
auto-parser's: autoparse/streamed.py)."""


def partials_of(found: Partial | list[Partial] | None) -> list[Partial]:
    return found if isinstance(found, list) else [found] if found else []


def _kept(started: list[Partial], closed: bool) -> list[ParsedCall]:
    """The calls begun in a block that ends here: those before the last whole, the last with
    its arguments guessed whole where the block closed, as far as they are certain where the
    answer ends in it."""
    *done, (name, certain, guess, ident) = started
    return [ParsedCall(c[0], c[2], c[3]) for c in done] + \
        [ParsedCall(name, guess if closed else certain, ident)]


def _generic(inner: str, types: ParamTypes) -> Partial | None:
    found = partial_tool_call(inner, types)
    return (*found, None) if found else None


_FUNCTION = "<function="


def _generic_calls(inner: str, types: ParamTypes) -> list[Partial]:
    """A `<tool_call>` block's calls: its JSON call, or each of its XML functions in turn."""
    text = inner.lstrip(WHITESPACE)
    if not text.startswith(_FUNCTION):
        return partials_of(_generic(inner, types))
    found: list[Partial] = []
    for piece in text.split(_FUNCTION)[1:]:
        call = partial_xml_call(_FUNCTION + piece, types)
        if call is None:
            break
        found.append((*call, None))
    return found


def _r7b(inner: str, _types: ParamTypes) -> Partial | None:
    """Command-R7B `[{"tool_call_id": …, "tool_name": …, "parameters": {…`: the first action."""
    text = inner.lstrip(WHITESPACE).removeprefix("[").lstrip(WHITESPACE)
    try:  # the first action complete, whatever follows it
        value, end = json.JSONDecoder(strict=False).raw_decode(text)
        cut, added = text[:end], 0
    except ValueError:
        loaded = load_partial_json(text)
        if loaded is None:
            return None
        value, cut, added = loaded
    name = value.get("tool_name") if isinstance(value, dict) else None
    if not isinstance(name, str) or not name or (list(value)[-1] == "tool_name" and added and
                                                 cut[-added] == '"'):
        return None
    ident = value.get("tool_call_id")
    ident = str(ident) if isinstance(ident, (str, int)) else None
    parameters = value.get("parameters")
    if not isinstance(parameters, dict):
        return name, "", "{}", ident
    dumped = dump_arguments(parameters)
    open_in_args = max(added - 1, 0) if list(value)[-1] == "parameters" else 0
    return name, dumped[:len(dumped) - open_in_args], dumped, ident


def _r7b_calls(inner: str, types: ParamTypes) -> list[Partial]:
    """Each action of Command-R7B's list begun so far, in turn."""
    items, open_item = list_items(inner)
    found: list[Partial] = []
    for item in items:
        call = call_from_object(item)
        if call is None:
            return found
        ident = item.get("tool_call_id")
        found.append((call.name, call.arguments, call.arguments,
                      call.id or (str(ident) if ident is not None else None)))
    return found + partials_of(_r7b(open_item, types) if open_item else None)


def _kimi(inner: str, _types: ParamTypes) -> Partial | None:
    """Kimi-K2 `functions.NAME:0<|tool_call_argument_begin|>{…` (in a section or not)."""
    text = inner.lstrip(WHITESPACE).removeprefix(KIMI_CALL_BEGIN)
    ident, sep, body = text.partition(KIMI_ARGS_BEGIN)
    found = _KIMI_ID.fullmatch(ident.strip(WHITESPACE))
    if not sep or found is None or KIMI_CALL_BEGIN in ident:
        return None
    arguments = partial_arguments(body) if body.strip(WHITESPACE) else ("", "{}")
    certain, guess = arguments or ("", "{}")
    return found.group(1), certain, guess, ident.strip(WHITESPACE)


def _kimi_calls(inner: str, types: ParamTypes, *, opened: bool = False) -> list[Partial]:
    """Each Kimi-K2 call of a section begun so far (`opened`: the block's own marker opened
    the first call, the calls after it begin where their `<|tool_call_begin|>` is written)."""
    pieces = inner.split(KIMI_CALL_BEGIN)
    head, pieces = ("", pieces) if opened else (pieces[0], pieces[1:])
    found: list[Partial] = []
    if head.strip(WHITESPACE):
        return found
    for piece in pieces:
        call = _kimi(piece.split(KIMI_CALL_END)[0], types)
        if call is None:
            break
        found.append(call)
    return found


def _glm(inner: str, types: ParamTypes) -> Partial | None:
    """GLM `NAME\n<arg_key>K</arg_key><arg_value>V</arg_value>…`: the name once a newline or
    `<arg_key>` ends it, the key/value pairs as each closes; the arguments' object stays open
    until the call's end tag (llama.cpp closes it there: a call cut short keeps `{"k":v`)."""
    text = inner.lstrip(WHITESPACE)
    if text.startswith("<function=") or text[:1] in ("{", "["):
        return _generic(inner, types)
    ends = [at for at in (text.find("\n"), text.find("<arg_key>")) if at >= 0]
    if not ends:
        return None
    name = text[:min(ends)].strip(WHITESPACE)
    if not _NAME.fullmatch(name):
        return None
    pairs, pos = [], min(ends)
    for found in _GLM_ARG.finditer(text, pos):
        if text[pos:found.start()].strip(WHITESPACE):
            break
        pairs.append((found.group(1), found.group(2)))
        pos = found.end()
    arguments = _typed_arguments(name, pairs, types)
    return name, arguments[:-1], arguments, None


def _leading(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """The matches of `pattern` that `text` starts with, one after another (whitespace
    between them)."""
    found, pos = [], 0
    for match in pattern.finditer(text):
        if text[pos:match.start()].strip(WHITESPACE):
            break
        found.append(match)
        pos = match.end()
    return found


def _open(name: str, arguments: dict[str, object], closed: bool) -> Partial:
    dumped = dump_arguments(arguments)
    return name, dumped if closed else dumped[:-1], dumped, None


_DSML_OPEN = re.compile(rf'\s*<{DSML}invoke name="([^"]+)">')
_DSML_END = f"</{DSML}invoke>"


def _dsml(inner: str, types: ParamTypes) -> Partial | None:
    """DeepSeek V3.2/V4 `<｜DSML｜invoke name="NAME">` (the first of the block): the name once
    its tag is written, the parameters as each closes, the arguments closed with the invoke."""
    found = _DSML_OPEN.match(inner)
    if found is None:
        return None
    name, body = found.group(1).strip(WHITESPACE), inner[found.end():]
    done = body.find(_DSML_END)
    params = [(m.group(1), m.group(2) or "", m.group(3))
              for m in _leading(_DSML_PARAM, body if done < 0 else body[:done])]
    return _open(name, dsml_arguments(name, params, types), done >= 0)


def _dsml_calls(inner: str, types: ParamTypes) -> list[Partial]:
    """Each DSML invoke of the block begun so far, in turn."""
    found: list[Partial] = []
    rest = inner
    while (opened := _DSML_OPEN.match(rest)) is not None:
        end = rest.find(_DSML_END, opened.end())
        call = _dsml(rest if end < 0 else rest[:end + len(_DSML_END)], types)
        if call is None:
            break
        found.append(call)
        if end < 0:
            break
        rest = rest[end + len(_DSML_END):]
    return found


_CPM_NAME = re.compile(r'([^"<>]+)">')


def _minicpm5(inner: str, types: ParamTypes) -> Partial | None:
    """MiniCPM 5 `NAME"><param name="K">V</param>…` (after `<function name="`): the name once
    its tag ends, the parameters as each closes; open until `</function>`."""
    found = _CPM_NAME.match(inner)
    if found is None:
        return None
    name, known = found.group(1).strip(WHITESPACE), types.get(found.group(1).strip(WHITESPACE), {})
    params = _leading(_CPM_PARAM, inner[found.end():])
    return _open(name, {m.group(1): typed_value(m.group(2) or m.group(3), known.get(m.group(1)))
                        for m in params}, False)


_MUSE_OPEN = re.compile(r'\s*[^<\s]+\s*<\|message\|>\s*<atem:function_calls>\s*'
                        r'<atem:invoke name="([^"]+)">')


def _muse(inner: str, types: ParamTypes) -> Partial | None:
    """Muse Glimmer `TOOL<|message|><atem:function_calls><atem:invoke name="NAME">` (after
    `to=`): the name once its tag ends, the parameters as each closes; open until the block's
    `</atem:function_calls>`."""
    found = _MUSE_OPEN.match(inner)
    if found is None:
        return None
    name = found.group(1)
    known = types.get(name, {})
    params = _leading(_ATEM_PARAM, inner[found.end():])
    return _open(name, {m.group(1): typed_value(m.group(2), known.get(m.group(1)))
                        for m in params}, False)


STREAMED: dict[object, BlockPartials] = {
    parse_tool_call_block: _generic_calls, parse_xml_calls: _generic_calls,
    parse_pythonic_calls: pythonic_calls, parse_command_r_action: _r7b_calls,
    parse_kimi_section: _kimi_calls, parse_glm_tool_call: _glm,
    parse_kimi_call: lambda inner, types: _kimi_calls(inner, types, opened=True),
    parse_dsml_calls: _dsml_calls, parse_minicpm5_call: _minicpm5, parse_muse_call: _muse,
    parse_listed_calls: listed_json, parse_apertus_calls: listed_apertus,
    parse_minimax_calls: listed_minimax,
}
"""Block parser → the reader of its block while it is still open."""
OPEN_UNTIL_CLOSED = frozenset({parse_glm_tool_call, parse_minicpm5_call, parse_muse_call})
"""Block parsers whose calls' arguments llama.cpp closes only at the call's end tag: a call cut
short keeps its arguments open, its last pair written whole or not."""


_GEMMA4_NAME = re.compile(r"call:([^{]+)\{")


def _gemma4(inner: str, _types: ParamTypes) -> Partial | None:
    """Gemma 4 `call:NAME{…` cut short: the call once its `{` is written."""
    found = _GEMMA4_NAME.match(inner)
    name = found.group(1).strip(WHITESPACE) if found else ""
    return (name, "{", "{}", None) if name else None


_K3_CALL = re.compile(r'\s*<\|open\|>call tool="([^"]+)"[^<]*<\|sep\|>')


def _kimi_k3(inner: str, _types: ParamTypes) -> Partial | None:
    """Kimi K3 `<|open|>call tool="NAME" index="1"<|sep|>…` cut short: the call once its
    opening tag is written."""
    found = _K3_CALL.match(inner)
    return (found.group(1), "{", "{}", None) if found else None


CUT_SHORT: dict[object, PartialReader] = {parse_gemma4_call: _gemma4,
                                          parse_kimi_k3_tools: _kimi_k3}
"""Block parser → the reader of its block cut short, where its calls are not streamed while
written (a call streamed could not be taken back where its block turns out broken)."""
DROPPED_WHEN_BROKEN = frozenset({parse_gemma4_call})
"""Block parsers whose closed block that does not parse is dropped, as llama.cpp's parser
drops it (Gemma 4's), not content."""


def kept_call(reader: BlockPartials, inner: str, types: ParamTypes, *, closed: bool,
              ) -> list[ParsedCall] | None:
    """The calls a block that does not parse keeps, once named (`_kept`)."""
    started = partials_of(reader(inner, types))
    return _kept(started, closed) if started else None


def cut_block_calls(inner: str, parse: Callable[[str, ParamTypes], list[ParsedCall] | None],
                    types: ParamTypes, streamed: BlockPartials | None = None,
                    ) -> tuple[list[ParsedCall], str | None]:
    """(the calls, the arguments guessed so far or None) of a block the answer ends in, cut
    short (`max_tokens`), as llama.cpp's lenient parse reads it: the calls written whole, else
    the calls once named, the last one's arguments as far as they go (unclosed), else none.
    `streamed`: the block's open reader, where it is not one of STREAMED (the auto-parser's)."""
    calls = [] if parse in OPEN_UNTIL_CLOSED else parse(inner, types) or []
    reader = streamed or STREAMED.get(parse) or CUT_SHORT.get(parse)
    started = partials_of(reader(inner, types)) if not calls and reader is not None else []
    if started:
        return _kept(started, closed=False), started[-1][1]
    if not calls and parse is parse_json_calls:  # a JSON list of calls, cut short
        return cut_short_calls(inner) or [], None
    return calls, None
