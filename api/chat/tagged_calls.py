"""Tool calls of the agent-model families whose blocks only their own templates announce
(chat_formats.py says which template writes which), turned from the complete text of one
block into `ParsedCall`s, or `None` when the text is not a well-formed call (it then stays
content). As llama.cpp's chat parsers read them:

- GLM-4.5/4.6: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`
- MiniMax-M2: `<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>…</invoke>
  …</minimax:tool_call>`
- Seed-OSS: `<seed:tool_call><function=NAME><parameter=K>V</parameter></function></seed:tool_call>`
  (Qwen3-Coder's XML in Seed's tags)
- Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
  <|tool_call_argument_begin|>{json}<|tool_call_end|>…<|tool_calls_section_end|>` (the id is
  `functions.NAME:0`, as llama.cpp keeps it)
- Command-R7B: `<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>`
- Granite 3.x: `<|tool_call|>[{"name", "arguments"}]` to the end of the answer

Parameter values written as text (GLM, MiniMax, Seed, Qwen3-Coder) are typed by the tool's
schema: a `string` parameter keeps its text as written (`"007"` stays a string), anything else
is read as JSON when it reads as JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from api.chat.tool_formats import (
    WHITESPACE,
    ParsedCall,
    calls_from_json_text,
    calls_from_list,
    dump_arguments,
    load_json,
    parse_function_tag,
    unwrap_value,
    xml_value,
)

ParamTypes = Mapping[str, Mapping[str, Any]]
"""Tool name → parameter name → the JSON-schema `type` its schema gives (absent: unknown)."""

_NAME = re.compile(r"[\w.\-:]+")


def param_types(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tool's parameter types, from validated OpenAI tool definitions."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") or {}
        parameters = function.get("parameters") or {}
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        out[function.get("name", "")] = {
            key: _schema_type(spec) for key, spec in (properties or {}).items()
            if isinstance(spec, dict)}
    return out


def _schema_type(spec: Mapping[str, Any]) -> Any:
    """A parameter's `type`; for `anyOf`/`oneOf` without one, the list of the alternatives'
    types (a list reads as "unknown" to `typed_value`)."""
    if "type" in spec:
        return spec["type"]
    alternatives = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(alternatives, list):
        return [alt["type"] for alt in alternatives if isinstance(alt, dict) and "type" in alt]
    return None


def typed_value(raw: str, schema_type: Any) -> Any:
    """A parameter's text as its schema types it (see the module doc)."""
    if schema_type == "string":
        return unwrap_value(raw)
    return xml_value(raw)


def _typed_arguments(name: str, pairs: list[tuple[str, str]], types: ParamTypes) -> str:
    known = types.get(name, {})
    return dump_arguments({key.strip(WHITESPACE): typed_value(value, known.get(
        key.strip(WHITESPACE))) for key, value in pairs})


def _only_whitespace_left(text: str, pattern: re.Pattern[str]) -> bool:
    return not pattern.sub("", text).strip(WHITESPACE)


_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def parse_glm_call(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of GLM's `<tool_call>…</tool_call>`: the name, then key/value pairs."""
    text = inner.strip(WHITESPACE)
    at = text.find("<arg_key>")
    name = (text if at < 0 else text[:at]).strip(WHITESPACE)
    if not _NAME.fullmatch(name) or not _only_whitespace_left(text[len(name):], _GLM_ARG):
        return None
    pairs = _GLM_ARG.findall(text)
    return [ParsedCall(name=name, arguments=_typed_arguments(name, pairs, types))]


_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


def parse_minimax_calls(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of `<minimax:tool_call>…</minimax:tool_call>`: one or more invokes."""
    calls = []
    for match in _MINIMAX_INVOKE.finditer(inner):
        name = match.group(1).strip(WHITESPACE)
        if not _only_whitespace_left(match.group(2), _MINIMAX_PARAM):
            return None
        pairs = _MINIMAX_PARAM.findall(match.group(2))
        calls.append(ParsedCall(name=name, arguments=_typed_arguments(name, pairs, types)))
    if not calls or not _only_whitespace_left(inner, _MINIMAX_INVOKE):
        return None
    return calls


_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def parse_xml_calls(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """Qwen3-Coder's XML (in `<tool_call>`, or Seed-OSS's `<seed:tool_call>`):
    `<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>`, one or more."""
    calls = []
    for match in _XML_FUNCTION.finditer(inner):
        name = match.group(1).strip(WHITESPACE)
        if not _only_whitespace_left(match.group(2), _XML_PARAMETER):
            return None
        pairs = _XML_PARAMETER.findall(match.group(2))
        calls.append(ParsedCall(name=name, arguments=_typed_arguments(name, pairs, types)))
    if not calls or not _only_whitespace_left(inner, _XML_FUNCTION):
        return None
    return calls


def parse_function_xml(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The text after `<function=` up to `</function>`: Qwen3-Coder's XML, or Llama 3.1's
    `NAME>{json}`."""
    calls = parse_xml_calls(f"<function={inner}</function>", types)
    return calls if calls is not None else parse_function_tag(inner)


def parse_tool_call_block(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of `<tool_call>…</tool_call>`: JSON (one or more) or Qwen3-Coder's XML."""
    text = inner.strip(WHITESPACE)
    if text.startswith("<function="):
        return parse_xml_calls(text, types)
    return calls_from_json_text(text)


def parse_glm_tool_call(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """`<tool_call>…</tool_call>` under a GLM template: GLM's name and key/value pairs, or
    the JSON and XML of `parse_tool_call_block`."""
    text = inner.strip(WHITESPACE)
    if text.startswith("<function=") or text[:1] in ("{", "["):
        return parse_tool_call_block(text, types)
    return parse_glm_call(text, types)


KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN = "<|tool_call_begin|>"
KIMI_CALL_END = "<|tool_call_end|>"
KIMI_ARGS_BEGIN = "<|tool_call_argument_begin|>"
_KIMI_CALL = re.compile(re.escape(KIMI_CALL_BEGIN) + r"\s*([^<\s]+)\s*" + re.escape(
    KIMI_ARGS_BEGIN) + r"(.*?)" + re.escape(KIMI_CALL_END), re.DOTALL)
_KIMI_ID = re.compile(r"(?:functions\.)?([\w.\-]+?)(?::\d+)?")


def _kimi_call(call_id: str, body: str) -> ParsedCall | None:
    match = _KIMI_ID.fullmatch(call_id)
    try:
        arguments = load_json(body.strip(WHITESPACE) or "{}")
    except ValueError:
        return None
    if match is None or not isinstance(arguments, dict):
        return None
    return ParsedCall(name=match.group(1), arguments=dump_arguments(arguments), id=call_id)


def parse_kimi_section(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of Kimi-K2's calls section: one or more `<|tool_call_begin|>` calls."""
    calls = [_kimi_call(m.group(1), m.group(2)) for m in _KIMI_CALL.finditer(inner)]
    if not calls or None in calls or not _only_whitespace_left(inner, _KIMI_CALL):
        return None
    return [call for call in calls if call is not None]


def parse_kimi_call(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """Kimi-K2 calls written without their section (the text after `<|tool_call_begin|>`); a
    call whose `<|tool_call_end|>` the model left out ends where the next one begins, as
    llama.cpp reads it (Kimi-K2-Thinking's parallel calls)."""
    calls: list[ParsedCall] = []
    for piece in inner.split(KIMI_CALL_BEGIN):
        body = piece.rstrip(WHITESPACE).removesuffix(KIMI_CALL_END)
        found = parse_kimi_section(KIMI_CALL_BEGIN + body + KIMI_CALL_END, types)
        if found is None:
            return None
        calls += found
    return calls


def parse_command_r_action(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of Command-R7B's `<|START_ACTION|>…<|END_ACTION|>`: a JSON list of
    `{"tool_call_id", "tool_name", "parameters"}` (the id is kept)."""
    try:
        value = load_json(inner.strip(WHITESPACE))
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    ids = [item.get("tool_call_id") if isinstance(item, dict) else None for item in items]
    calls = calls_from_list(items)
    if calls is None:
        return None
    for call, call_id in zip(calls, ids, strict=True):
        if call_id is not None and not call.id:
            call.id = str(call_id)
    return calls


def parse_granite_calls(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """What follows Granite's `<|tool_call|>`: a JSON list of calls."""
    return calls_from_json_text(inner)
