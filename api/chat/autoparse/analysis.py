"""The differential analysis of a chat template (llama.cpp's common/chat-diff-analyzer.cpp):
the template is rendered with and without reasoning, content and tool calls, and the markers
around what differs are its reasoning tags, content wrappers and tool-call syntax.

`analyze(source)` is cached per template source: a model's template is analysed once."""

from __future__ import annotations

import functools
import re

from api.chat.autoparse.call_ids import call_id_markers
from api.chat.autoparse.diff import (
    MARKER,
    SPACE,
    WHITESPACE,
    Kind,
    prune_whitespace,
    segmentize,
    trim,
)
from api.chat.autoparse.model import Analysis, Content, Reasoning
from api.chat.autoparse.probe import (
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT_MSG,
    FUN_FIRST,
    THINKING,
    TOOLS,
    USER,
    USER_MSG,
    USER_MSG_TWO,
    Renderer,
    assistant,
    tool_call,
)
from api.chat.autoparse.tool_analysis import analyze_tools
from api.chat.autoparse.workarounds import apply_workarounds
from api.chat.caps import chat_template_caps


def _reasoning_presence(r: Renderer, reasoning: Reasoning) -> None:
    cmp = r.compare([USER, assistant()], [USER, assistant(reasoning=THINKING)])
    if cmp is None or THINKING not in cmp.diff.right:
        return
    think = re.escape(THINKING)
    wrapped = re.search(f"(?P<pre>{MARKER}{SPACE}){think}(?P<post>{SPACE}{MARKER}{SPACE})",
                        cmp.b)
    found = wrapped or re.search(f"{think}{SPACE}(?P<post>{MARKER}{SPACE})?", cmp.b)
    if found is None:
        return
    pre = found.groupdict().get("pre") or ""
    post = found.group("post") or ""
    if pre and post:
        reasoning.mode, reasoning.start, reasoning.end = "TAG_BASED", pre, post
    elif post:
        reasoning.mode, reasoning.end = "TAG_BASED", post


def _thinking_enabled(r: Renderer, reasoning: Reasoning) -> None:
    cmp = r.compare([USER], [USER], generation_prompt=True, thinking_a=False, thinking_b=True)
    if cmp is None:
        return
    left, right = trim(cmp.diff.left), trim(cmp.diff.right)
    if not left and cmp.diff.right:
        if right and cmp.b.endswith(right) and not reasoning.start:
            reasoning.start, reasoning.mode = cmp.diff.right, "TAG_BASED"
    elif not right and cmp.diff.left:
        if left and cmp.a.endswith(left) and not reasoning.end:
            seg = prune_whitespace(segmentize(cmp.a))
            if len(seg) >= 2 and seg[-1].value == left and seg[-2].kind is Kind.MARKER:
                reasoning.start = seg[-2].value
            reasoning.end, reasoning.mode = cmp.diff.left, "TAG_BASED"
    elif left and right:
        for base, extended in ((cmp.b, cmp.a), (cmp.a, cmp.b)):
            anchor = base[len(base) - min(len(base), 64):]
            pos = extended.rfind(anchor)
            if pos < 0 or pos + len(anchor) >= len(extended):
                continue
            extra = trim(extended[pos + len(anchor):])
            if not extra:
                continue
            seg = prune_whitespace(segmentize(extra))
            if len(seg) == 2 and all(s.kind is Kind.MARKER for s in seg):
                reasoning.start = reasoning.start or seg[0].value
                reasoning.end = reasoning.end or seg[1].value
                reasoning.mode = "TAG_BASED"
                break
    if reasoning.mode == "NONE" and not reasoning.start and reasoning.end:
        reasoning.mode = "TAG_BASED"


def _reasoning_scope(r: Renderer, reasoning: Reasoning) -> None:
    call = tool_call(FUN_FIRST, {ARG_FIRST: "VVVV", ARG_SECOND: "XXXX"})
    cmp = r.compare([USER, assistant(reasoning=THINKING)],
                    [USER, assistant(None, THINKING, [call])], TOOLS)
    if cmp is None or THINKING in cmp.a or THINKING not in cmp.b:
        return
    reasoning.mode = "TOOLS_ONLY"
    think = re.escape(THINKING)
    found = re.search(f"(?P<pre>{MARKER}{SPACE}){think}{SPACE}(?P<post>{MARKER}{SPACE})", cmp.b)
    if found:
        reasoning.start, reasoning.end = found.group("pre"), found.group("post")
        return
    found = re.search(f"{think}{SPACE}(?P<post>{MARKER}{SPACE})?", cmp.b)
    if found:
        reasoning.end = found.group("post") or ""
    else:
        reasoning.mode = "NONE"


def _content(r: Renderer, reasoning: Reasoning) -> Content:
    content = Content()
    with_tools = r.compare([USER, assistant()],
                           [USER, assistant("", calls=[tool_call("test_func",
                                                                 {"arg1": "value1"})])], TOOLS)
    with_reasoning = r.compare([USER, assistant()], [USER, assistant("", THINKING)], TOOLS)
    if with_tools is None or with_reasoning is None:
        return content
    tools_left, reasoning_left = with_tools.diff.left, with_reasoning.diff.left
    plain = False
    if trim(tools_left) == ASSISTANT_MSG:
        # llama.cpp reads the reasoning diff's left side as `space, itself, …`: its space
        # takes the leading whitespace first, so only a side that starts with none matches
        plain = not reasoning_left or reasoning_left[0] not in WHITESPACE or bool(
            reasoning.mode != "NONE" and reasoning.end and re.search(
                f"{re.escape(reasoning.end)}{SPACE}{re.escape(ASSISTANT_MSG)}", reasoning_left))
    if not plain:
        rdiff = reasoning_left
        if reasoning.end and reasoning.end in rdiff:
            rdiff = rdiff[rdiff.find(reasoning.end) + len(reasoning.end):]
        pure = rdiff if len(rdiff) > len(tools_left) else tools_left
        found = re.search(f"(?P<pre>{MARKER}{SPACE}){re.escape(ASSISTANT_MSG)}{SPACE}"
                          f"(?P<post>{MARKER}{SPACE})", pure)
        if found:
            content.start, content.end = found.group("pre"), found.group("post")
    if content.start or content.end:
        content.mode = "ALWAYS_WRAPPED"
    return content


def _assistant_start(r: Renderer, reasoning: Reasoning) -> str:
    cmp = r.compare([USER], [USER, assistant()])
    if cmp is None:
        return ""
    right = cmp.diff.right
    prefix = right[:right.find(ASSISTANT_MSG)] if ASSISTANT_MSG in right else right
    for tag in (trim(reasoning.start), trim(reasoning.end)):
        if tag and tag in prefix:
            prefix = prefix[:prefix.find(tag)]
    return trim(prefix)


def _user_start(r: Renderer) -> str:
    cmp = r.compare([], [USER])
    if cmp is None:
        cmp = r.compare([{"role": "user", "content": USER_MSG_TWO}, assistant()],
                        [{"role": "user", "content": USER_MSG_TWO}, assistant(), USER])
        if cmp is None:
            return ""
    text = cmp.diff.right
    if ASSISTANT_MSG in text:
        text = text[text.find(ASSISTANT_MSG) + len(ASSISTANT_MSG):]
    candidate = text[:text.find(USER_MSG)] if USER_MSG in text else text
    out, seen_marker = "", False
    for seg in segmentize(candidate):
        lower = seg.value.lower()
        if seg.kind is Kind.MARKER and not seen_marker and ("end" in lower or "close" in lower):
            continue
        if seg.kind is Kind.TEXT and not seen_marker and not trim(seg.value):
            continue
        seen_marker |= seg.kind is Kind.MARKER
        out += seg.value
    return trim(out)


@functools.lru_cache(maxsize=32)
def analyze(source: str) -> Analysis:
    """The analysis of one template (cached per source)."""
    r = Renderer(source)
    caps = chat_template_caps(source)
    analysis = Analysis(supports_tool_calls=caps["supports_tool_calls"],
                        supports_parallel_tool_calls=caps["supports_parallel_tool_calls"])
    _reasoning_presence(r, analysis.reasoning)
    _thinking_enabled(r, analysis.reasoning)
    if caps["supports_tool_calls"]:
        _reasoning_scope(r, analysis.reasoning)
    analysis.content = _content(r, analysis.reasoning)
    if caps["supports_tool_calls"]:
        analysis.tools = analyze_tools(r, analysis.reasoning.start, analysis.reasoning.end,
                                       caps["supports_parallel_tool_calls"])
        if analysis.tools.mode not in ("NONE", "JSON_NATIVE"):
            call_id_markers(r, analysis.tools)
    analysis.assistant_start = _assistant_start(r, analysis.reasoning)
    analysis.user_start = _user_start(r)
    apply_workarounds(source, analysis)
    return analysis
