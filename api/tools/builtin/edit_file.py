"""edit_file: exact text replacements, with llama-server's fallback when an old_text is not
found as it is: both sides normalised (trailing whitespace, smart quotes, dashes, odd spaces)
and the lines that no edit touches kept as they were (`server-tools.cpp`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from api.tools.errors import ToolArgumentError, missing_key
from api.tools.params import required
from api.tools.tool import Json, ServerTool, ToolCall, function, prop
from api.tools.tools_io import FileRefused

_FUZZY = str.maketrans({
    **{c: "'" for c in "\u2018\u2019\u201a\u201b"},
    **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
    **{c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"},
    **{c: " " for c in "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
       "\u202f\u205f\u3000"},
})


def normalize(content: str) -> str:
    """Each line's trailing whitespace dropped and its look-alike characters made ASCII; the
    lines stay where they were."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in content.split("\n"))


@dataclass
class Match:
    edit_index: int
    index: int
    length: int
    new_text: str


def apply(content: str, matches: list[Match], offset: int = 0) -> str:
    for m in reversed(matches):
        at = m.index - offset
        content = content[:at] + m.new_text + content[at + m.length:]
    return content


def _lines_with_ends(content: str) -> list[str]:
    parts = content.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _spans(content: str) -> list[tuple[int, int]]:
    spans, offset = [], 0
    for line in _lines_with_ends(content):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _line_range(spans: list[tuple[int, int]], m: Match) -> tuple[int, int]:
    start = next((i for i, (a, b) in enumerate(spans) if a <= m.index < b), 0)
    end = start
    while end < len(spans) and spans[end][1] < m.index + m.length:
        end += 1
    return start, min(end, len(spans) - 1) + 1


def apply_keeping_lines(original: str, base: str, matches: list[Match]) -> str:
    originals = _lines_with_ends(original)
    spans = _spans(base)
    groups: list[tuple[int, int, list[Match]]] = []
    for m in matches:
        start, end = _line_range(spans, m)
        if groups and start < groups[-1][1]:
            g_start, g_end, reps = groups[-1]
            groups[-1] = (g_start, max(g_end, end), [*reps, m])
        else:
            groups.append((start, end, [m]))
    out, next_line = [], 0
    for start, end, reps in groups:
        out.extend(originals[next_line:start])
        lo, hi = spans[start][0], spans[end - 1][1]
        out.append(apply(base[lo:hi], reps, lo))
        next_line = end
    out.extend(originals[next_line:])
    return "".join(out)


class EditFile(ServerTool):
    name = "edit_file"
    display_name = "Edit file"
    permission_write = True

    def definition(self) -> Json:
        edit = {"type": "object", "properties": {
            "old_text": prop("string", "Exact text to find; must be unique in the file and must "
                             "not overlap with other edits"),
            "new_text": prop("string", "Text to replace old_text with")},
            "required": ["old_text", "new_text"]}
        return function(
            self.name,
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in "
            "the file and is matched against the original content, not incrementally. Merge "
            "nearby changes into one edit instead of overlapping edits. Use write_file to "
            "replace the whole file.",
            {"path": prop("string", "Path to the file to edit"),
             "edits": {"type": "array", "description": "One or more exact text replacements to "
                       "apply", "items": edit}},
            ["path", "edits"])

    async def invoke(self, call: ToolCall) -> Json:
        path = required(call.params, "path", str)
        if "edits" not in call.params:
            raise missing_key("edits")
        raw = call.params["edits"]
        if not isinstance(raw, list) or not raw:
            return {"error": "\"edits\" must be a non-empty array"}
        edits: list[tuple[str, str]] = []
        for item in raw:
            if not isinstance(item, dict):
                raise ToolArgumentError("[json.exception.type_error.304] cannot use at() with "
                                        + ("array" if isinstance(item, list) else "string"))
            old, new = required(item, "old_text", str), required(item, "new_text", str)
            if not old:
                return {"error": f"edits[{len(edits)}].old_text must not be empty"}
            edits.append((old, new))
        try:
            data = await call.io.read_file(path)
        except FileRefused as exc:
            return {"error": str(exc)}
        if data is None:
            return {"error": f"failed to open file: {path}"}
        # the matching in a thread: a file may have up to FILE_READ_MAX bytes
        planned = await call.io.offload(plan, path, data, edits)
        if isinstance(planned, dict):
            return planned
        try:
            written = await call.io.write_file(path, planned.encode())
        except FileRefused as exc:
            return {"error": str(exc)}
        if not written:
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


def plan(path: str, data: bytes, edits: list[tuple[str, str]]) -> str | Json:
    """The edited content, or the tool's error."""
    original = data.decode("utf-8", "replace")
    fuzzy_original = normalize(original)
    any_fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in fuzzy_original:
            return {"error": f"could not find edits[{i}].old_text in {path}, it must match "
                             "the file's current content exactly"}
        any_fuzzy = True
    base = fuzzy_original if any_fuzzy else original
    matches = []
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if any_fuzzy else old
        occurrences = fuzzy_original.count(normalize(old))
        if occurrences > 1:
            return {"error": f"found {occurrences} occurrences of edits[{i}].old_text in "
                             f"{path}, it must be unique"}
        matches.append(Match(i, base.find(needle), len(needle), new))
    matches.sort(key=lambda m: m.index)
    for a, b in itertools.pairwise(matches):
        if a.index + a.length > b.index:
            return {"error": f"edits[{a.edit_index}] and edits[{b.edit_index}] overlap in "
                             f"{path}; merge them into one edit or target disjoint regions"}
    content = apply_keeping_lines(original, base, matches) if any_fuzzy else \
        apply(base, matches)
    if content == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    return content

