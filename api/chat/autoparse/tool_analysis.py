"""The tool-call half of llama.cpp's differential analysis (common/chat-diff-analyzer.cpp,
`analyze_tools`): a call's syntax from renders of one call, two calls, other names, other
arguments and other values."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from api.chat.autoparse.diff import (
    MARKER,
    SPACE,
    diff_split,
    last_marker,
    trim,
    trim_leading,
    until_common_prefix,
)
from api.chat.autoparse.probe import (
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT_MSG,
    CALL_ID_002,
    FUN_FIRST,
    FUN_SECOND,
    TOOLS,
    USER,
    Renderer,
    assistant,
    tool_call,
)

FIRST_CALL = tool_call(FUN_FIRST, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"})
SECOND_CALL = tool_call(FUN_SECOND, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}, CALL_ID_002)
_NOT_FOUND = 1 << 62


@dataclass
class ToolAnalysis:
    mode: str = "NONE"  # NONE, JSON_NATIVE, TAG_WITH_JSON, TAG_WITH_TAGGED
    section_start: str = ""
    section_end: str = ""
    per_call_start: str = ""
    per_call_end: str = ""
    fun_name_is_key: bool = False
    tools_array_wrapped: bool = False
    openai_wrapper_trigger: bool = False
    function_field: str = "function"
    name_field: str = "name"
    args_field: str = "arguments"
    id_field: str = ""
    gen_id_field: str = ""
    parameter_order: list[str] = field(default_factory=list)
    name_prefix: str = ""
    name_suffix: str = ""
    args_separator: str = ""
    close: str = ""
    args_start: str = ""
    args_end: str = ""
    arg_name_prefix: str = ""
    arg_name_suffix: str = ""
    arg_value_prefix: str = ""
    arg_value_suffix: str = ""
    arg_separator: str = ""
    tolerate_intertag_whitespace: bool = False
    call_id_pos: str = "NONE"  # NONE, PRE_FUNC_NAME, BETWEEN_FUNC_AND_ARGS, POST_ARGS
    call_id_prefix: str = ""
    call_id_suffix: str = ""


def _calls(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    return [USER, assistant("", calls=list(calls))]


def analyze_tools(r: Renderer, reasoning_start: str, reasoning_end: str,
                  parallel: bool) -> ToolAnalysis:
    t = ToolAnalysis()
    cmp = r.compare([USER, assistant()], _calls(FIRST_CALL), TOOLS)
    if cmp is None or not cmp.diff.right:
        return t
    _call_format(r, t, cmp.diff.right, reasoning_start, reasoning_end, parallel)
    if t.mode not in ("NONE", "JSON_NATIVE"):
        if parallel:
            _per_call_markers(r, t)
        _function_markers(r, t)
        if t.mode == "TAG_WITH_TAGGED":
            _argument_names(r, t)
            _argument_values(r, t)
        _argument_separator(r, t)
    return t


def _in_json(haystack: str, needle: str) -> bool:
    return re.search(f'[{{:]{SPACE}"{re.escape(needle)}"', haystack) is not None


def _call_format(r: Renderer, t: ToolAnalysis, haystack: str, reasoning_start: str,
                 reasoning_end: str, parallel: bool) -> None:
    if _in_json(haystack, FUN_FIRST):
        t.mode = "JSON_NATIVE"
    elif _in_json(haystack, ARG_FIRST):
        t.mode = "TAG_WITH_JSON"
    else:
        t.mode = "TAG_WITH_TAGGED"
    clean = haystack
    for tag in (reasoning_start, reasoning_end):
        if tag and tag in clean:
            pos = clean.find(tag)
            clean = clean[:pos] + clean[pos + len(tag):]
    if t.mode == "JSON_NATIVE":
        _json_native(t, clean)
        if parallel:
            cmp = r.compare(_calls(FIRST_CALL), _calls(FIRST_CALL, SECOND_CALL), TOOLS)
            if cmp is not None and t.section_start and t.section_start in cmp.diff.right:
                t.per_call_start, t.per_call_end = t.section_start, t.section_end
                t.section_start = t.section_end = ""
    else:
        _non_json(t, clean)
    t.section_end, t.per_call_end = trim(t.section_end), trim(t.per_call_end)


def _json_native(t: ToolAnalysis, clean: str) -> None:
    start, end = clean.find("{"), clean.rfind("}")
    cut = clean[start:end + 1]
    try:
        call = json.loads(cut)
    except ValueError:
        return
    if not isinstance(call, dict):
        return

    def register(prefix: str, key: str, value: Any) -> None:
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, str) and "call0000" in value:
            t.id_field = path
        elif isinstance(value, str) and value == FUN_FIRST:
            t.name_field = path
        elif ARG_FIRST in json.dumps(value, ensure_ascii=False):
            t.args_field = path
        elif "id" in key:
            t.gen_id_field = path

    for key, value in call.items():
        if key == FUN_FIRST:
            t.fun_name_is_key = True
            t.name_field = t.args_field = ""
            continue
        if isinstance(value, dict) and ARG_FIRST not in json.dumps(value, ensure_ascii=False):
            t.function_field = key
            for sub_key, sub_value in value.items():
                register(key, sub_key, sub_value)
        register("", key, value)
    wrapped = re.search(f"(?P<pre>\\[{SPACE}){re.escape(cut)}(?P<post>{SPACE}\\])", clean)
    if wrapped:
        t.tools_array_wrapped = True
        start -= len(wrapped.group("pre"))
        end += len(wrapped.group("post"))
    end += 1
    located = []
    for name in (t.name_field, t.args_field, t.id_field, t.gen_id_field):
        if name:
            pos = clean.find(name)
            located.append((pos if pos >= 0 else _NOT_FOUND, name))
    t.parameter_order = [name for _, name in sorted(located)]
    t.section_start = trim_leading(clean[:start])
    t.section_end = trim(clean[end:])
    if t.tools_array_wrapped and t.section_end == "]":
        t.section_end = ""


def _non_json(t: ToolAnalysis, clean: str) -> None:
    fun = re.escape(FUN_FIRST)
    fun_res = re.search(
        f"(?P<m>(?P<pre><(?:(?!>|{fun}).)*){fun}(?!{SPACE}<)[^>]*>{SPACE})"
        f"|(?P<m2>(?P<pre2>\\[(?:(?!\\]|{fun}).)*){fun}(?!{SPACE}\\[[^\\]]*\\]){SPACE})",
        clean, re.S)
    fun_marker, fun_pre = FUN_FIRST, ""
    if fun_res:
        fun_marker = fun_res.group("m") or fun_res.group("m2")
        fun_pre = fun_res.group("pre") or fun_res.group("pre2") or ""
    marker = re.escape(fun_marker)
    per_tool = re.search(f"(?P<sec>{MARKER}{SPACE})(?P<call>{MARKER}{SPACE})"
                         f"(?P<pre>(?:(?!{marker}).)*){marker}(?P<rest>.*)", clean, re.S)
    if per_tool:
        closers = re.search(f"(?P<call>{MARKER}{SPACE})(?P<sec>{MARKER}{SPACE})\\Z",
                            per_tool.group("rest"))
        t.name_prefix = fun_pre + t.name_prefix
        t.per_call_start, t.section_start = per_tool.group("call"), per_tool.group("sec")
        if closers:
            t.per_call_end, t.section_end = closers.group("call"), closers.group("sec")
        return
    section = re.search(f"(?P<sec>{MARKER}{SPACE}){marker}(?P<rest>.*)", clean, re.S)
    if section:
        t.section_start = section.group("sec")
        closer = re.search(f"(?P<sec>{MARKER}{SPACE})\\Z", section.group("rest"))
        if closer:
            t.section_end = closer.group("sec")


def _per_call_markers(r: Renderer, t: ToolAnalysis) -> None:
    cmp = r.compare(_calls(FIRST_CALL), _calls(FIRST_CALL, SECOND_CALL), TOOLS)
    if cmp is None:
        return
    second = trim_leading(diff_split(cmp.diff.suffix, cmp.diff.right).right)
    if t.section_start and second.startswith(t.section_start):
        t.per_call_start, t.per_call_end = t.section_start, t.section_end
        t.section_start = t.section_end = ""
    if t.per_call_end:
        one, two = cmp.a.count(t.per_call_end), cmp.b.count(t.per_call_end)
        if one > 0 and one == two:
            t.section_end, t.per_call_end = t.per_call_end, ""


def _function_markers(r: Renderer, t: ToolAnalysis) -> None:
    cmp = r.compare(_calls(FIRST_CALL), _calls(SECOND_CALL), TOOLS)
    if cmp is None:
        return
    diff = cmp.diff
    if FUN_FIRST not in diff.left or FUN_SECOND not in diff.right:
        return
    opener = t.per_call_start or t.section_start
    if opener and opener in diff.prefix:
        t.name_prefix = diff.prefix[diff.prefix.rfind(opener) + len(opener):]
    name = re.match(f"(?P<pre>(?:(?!{FUN_FIRST}).)*){FUN_FIRST}(?P<post>(?:(?!{MARKER}).)*)",
                    diff.left, re.S)
    if name:
        t.name_prefix += name.group("pre")
        t.name_suffix = name.group("post")
    if t.mode == "TAG_WITH_JSON":
        ext = re.match(f"(?P<ext>(?:{MARKER}|[^{{\\[])*+)(?:(?!{MARKER}).)*{MARKER}",
                       diff.suffix, re.S)
        if ext:
            t.name_suffix += ext.group("ext")
    else:
        ext_text = re.match(f"(?:(?!{MARKER}).)*", diff.suffix, re.S)
        ext_value = ext_text.group(0) if ext_text else ""
        t.name_suffix += ext_value
        args = f"{MARKER}{SPACE}(?:{ARG_FIRST}|{ARG_SECOND})"
        sep = re.match(f"(?P<sep>(?:(?!{args}).)*){args}", diff.suffix[len(ext_value):], re.S)
        if sep:
            t.args_separator = trim(sep.group("sep"))
    ender = t.per_call_end or t.section_end
    closer = ""
    if not ender:
        nocall = r.compare(_calls(FIRST_CALL), [USER, assistant(ASSISTANT_MSG)], TOOLS)
        if nocall is not None:
            left = nocall.diff.left
            closer = left[left.find("YYYY") + 4:] if "YYYY" in left else left[3:]
    else:
        pos = diff.suffix.find(ender)
        closer = diff.suffix[:pos] if pos >= 0 else diff.suffix
    if closer and t.mode == "TAG_WITH_TAGGED":
        found = re.match(f"(?:(?!YYYY).)*YYYY{SPACE}{MARKER}{SPACE}(?P<close>.*)", closer, re.S)
        if found:
            t.close = found.group("close")
    elif closer and t.mode == "TAG_WITH_JSON" and "YYYY" in closer:
        post = closer[closer.find("YYYY") + 4:]
        pos = max(post.rfind("}"), post.rfind("]"))
        if 0 <= pos < len(post) - 1:
            t.close = trim_leading(post[pos + 1:])
    t.close = trim_leading(t.close)


def _argument_names(r: Renderer, t: ToolAnalysis) -> None:
    cmp = r.compare(_calls(tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                    _calls(tool_call(FUN_FIRST, {ARG_SECOND: "YYYY"})), TOOLS)
    if cmp is None or not cmp.diff.left or not cmp.diff.right:
        return
    diff = cmp.diff
    left = re.search(f"(?P<pre>(?:(?!{ARG_FIRST}).)*){ARG_FIRST}(?P<suffix>[^\"X]*)",
                     diff.left, re.S)
    right = re.search(f"(?P<pre>(?:(?!{ARG_SECOND}).)*){ARG_SECOND}(?P<suffix>[^\"Y]*)",
                      diff.right, re.S)
    if left and right and left.group("pre") and left.group("pre") == right.group("pre") and \
            left.group("suffix") == right.group("suffix"):
        t.arg_name_prefix, t.arg_name_suffix = left.group("pre"), left.group("suffix")
    elif diff.left.startswith(ARG_FIRST) and diff.right.startswith(ARG_SECOND):
        t.arg_name_prefix = last_marker(diff.prefix) or diff.prefix
        after = diff.left[len(ARG_FIRST):] + diff.suffix
        suffix = re.match(f"(?:(?!{MARKER}).)*{MARKER}{SPACE}", after, re.S)
        if suffix:
            t.arg_name_suffix = suffix.group(0)


def _argument_values(r: Renderer, t: ToolAnalysis) -> None:
    cmp = r.compare(_calls(tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                    _calls(tool_call(FUN_FIRST, {ARG_FIRST: "YYYY"})), TOOLS)
    if cmp is None or cmp.diff.left != "XXXX" or cmp.diff.right != "YYYY":
        return
    ending = ARG_FIRST + t.arg_name_suffix
    prefix = cmp.diff.prefix
    if ending in prefix:
        prefix = prefix[prefix.rfind(ending) + len(ending):]
    if prefix:
        t.arg_value_prefix = last_marker(prefix) or prefix
    suffix = cmp.diff.suffix
    ender = t.close or t.per_call_end or t.section_end
    if ender and ender in suffix:
        suffix = suffix[:suffix.find(ender)]
    if trim(suffix):
        t.arg_value_suffix = suffix


def _argument_separator(r: Renderer, t: ToolAnalysis) -> None:
    cmp = r.compare(_calls(tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})), _calls(FIRST_CALL),
                    TOOLS)
    if cmp is not None and cmp.diff.right:
        t.arg_separator = until_common_prefix(cmp.diff.right, ARG_FIRST, ARG_SECOND)
