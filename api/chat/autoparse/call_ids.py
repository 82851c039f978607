"""Where a template writes a call's id (llama.cpp's `extract_call_id_markers` in
common/chat-diff-analyzer.cpp): the renders of one call under two ids differ in the id, and the
markers around it (`[CALL_ID]` … `[ARGS]` in Mistral's `[TOOL_CALLS]name[CALL_ID]id[ARGS]{…}`)
are read from what is left and right of it."""

from __future__ import annotations

import re

from api.chat.autoparse.diff import MARKER
from api.chat.autoparse.probe import (
    ARG_FIRST,
    ARG_SECOND,
    CALL_ID_001,
    CALL_ID_999,
    FUN_FIRST,
    TOOLS,
    USER,
    Renderer,
    assistant,
    tool_call,
)
from api.chat.autoparse.tool_analysis import FIRST_CALL, ToolAnalysis

ALT_ID_CALL = tool_call(FUN_FIRST, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}, CALL_ID_999)


def _first_marker(text: str) -> str:
    found = re.search(MARKER, text)
    return found.group(0) if found else ""


def _last_marker(text: str) -> str:
    """The last marker in `text`, no marker starting after it (just the marker)."""
    markers = re.findall(MARKER, text)
    return markers[-1] if markers else ""


def _common_id_part() -> str:
    n = 0
    while n < min(len(CALL_ID_001), len(CALL_ID_999)) and CALL_ID_001[n] == CALL_ID_999[n]:
        n += 1
    return CALL_ID_001[:n]


def call_id_markers(r: Renderer, t: ToolAnalysis) -> None:
    """Sets `t.call_id_pos` (NONE, PRE_FUNC_NAME, BETWEEN_FUNC_AND_ARGS, POST_ARGS) and the
    markers before and after the id."""
    cmp = r.compare([USER, assistant("", calls=[FIRST_CALL])],
                    [USER, assistant("", calls=[ALT_ID_CALL])], TOOLS)
    if cmp is None or not (cmp.diff.left or cmp.diff.right):
        return
    prefix, suffix = cmp.diff.prefix, cmp.diff.suffix
    common = re.escape(_common_id_part())
    in_prefix, in_suffix = prefix.rfind(FUN_FIRST), suffix.find(FUN_FIRST)
    if in_prefix >= 0 and in_suffix < 0:
        args_in_prefix, args_in_suffix = prefix.find("{", in_prefix), suffix.find("{")
        if args_in_suffix >= 0 and args_in_prefix < 0:
            t.call_id_pos = "BETWEEN_FUNC_AND_ARGS"
            after_func = prefix[in_prefix + len(FUN_FIRST):]
            found = re.search(f"(?P<m>{MARKER})(?:(?!{MARKER})(?!{common}).)*{common}",
                              after_func, re.S)
            t.call_id_prefix = found.group("m") if found else _last_marker(after_func)
            t.call_id_suffix = _first_marker(suffix)
        elif args_in_prefix >= 0:
            t.call_id_pos = "POST_ARGS"
            after_args = prefix[args_in_prefix:]
            brace = after_args.rfind("}")
            if brace >= 0:
                t.call_id_prefix = _last_marker(after_args[brace + 1:])
            t.call_id_suffix = _first_marker(suffix)
    elif in_suffix >= 0 and in_prefix < 0:
        t.call_id_pos = "PRE_FUNC_NAME"
        t.call_id_prefix = _last_marker(prefix)
        t.call_id_suffix = _first_marker(suffix[:in_suffix])
    if t.call_id_prefix == t.args_end:
        t.call_id_prefix = ""
    if t.call_id_suffix == t.args_start:
        t.call_id_suffix = ""
    if t.call_id_pos != "NONE" and t.call_id_suffix and \
            t.per_call_end.startswith(t.call_id_suffix):
        t.per_call_end = ""
