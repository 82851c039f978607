"""A forced call (`tool_choice` "required" or a named function) in the template's own format
where llama.cpp's auto-parser reads the template: its grammar writes the call section, the
function's markers and name, then the arguments' JSON (common/chat-auto-parser-generator.cpp,
`build_tool_parser_tag_json`), one alternative per function. llamaq frames the arguments'
schema with those markers (the job's `json_schema_frame`): the markers up to the name, then
each function's name and the markers after it before that function's schema (tool_grammar.py
`native_tool_call`). Where the arguments are tagged pairs (Hy3's `<arg_key>K</arg_key>
<arg_value>V</arg_value>`, `build_tool_parser_tag_tagged`), each function's schema carries the
pairs' markers and the worker writes its arguments so (worker/engine/tagged_grammar.py). A
template whose calls are neither is forced to the generic JSON call (docs/endpoints.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from api.chat.autoparse.analysis import analyze
from api.chat.autoparse.syntax import auto_syntax
from api.chat.request_tools import ToolChoice
from api.chat.tool_grammar import CallFrame


def _name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function", tool)
    return str(function.get("name", "")) if isinstance(function, Mapping) else ""


def auto_call_frame(source: str, tools: Sequence[Mapping[str, Any]],
                    choice: ToolChoice, *, tagged: bool = True) -> CallFrame | None:
    """The frame of a forced call under a template the auto-parser reads, None where it is
    not one whose calls are a tagged name and JSON or (where `tagged`: llama.cpp's own
    auto-parser reads the template, its grammar writes them) tagged arguments."""
    syntax = auto_syntax(source)
    if syntax is None or syntax.read is None:
        return None
    names = [choice.name] if choice.name is not None else [_name(t) for t in tools]
    if not names or not all(names):
        return None
    t = analyze(source).tools
    if t.mode not in ("TAG_WITH_JSON", "TAG_WITH_TAGGED" if tagged else ""):
        return None
    prefix = t.section_start + t.per_call_start + t.name_prefix
    suffix = t.args_end + t.close + t.per_call_end + t.section_end
    pairs = (t.arg_name_prefix, t.arg_name_suffix + t.arg_value_prefix, t.arg_value_suffix) \
        if t.mode == "TAG_WITH_TAGGED" else None
    if pairs is not None and (not (pairs[0] and pairs[2]) or t.arg_separator.strip()):
        return None  # pairs the grammar could not delimit
    return CallFrame(prefix, suffix, shape="arguments", tagged=pairs,
                     after_name=t.name_suffix + t.args_separator + t.args_start)
