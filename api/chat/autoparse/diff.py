"""Diffing two renders of a template, marker-aware (llama.cpp's
common/chat-auto-parser-helpers.cpp: `segmentize_markers`, `calculate_diff_split`,
`until_common_prefix`, `after_common_suffix`). A marker is `<…>` or `[…]`; the rest is text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

WHITESPACE = " \t\n\r\f\v"
MARKER = r"(?:<[^>]*>|\[[^\]]*\])"
"""A marker as a regular expression (llama.cpp's `p.marker()`)."""
SPACE = r"[ \t\n\r\f\v]*"


def trim(text: str) -> str:
    return text.strip(WHITESPACE)


def trim_leading(text: str) -> str:
    return text.lstrip(WHITESPACE)


class Kind(Enum):
    TEXT = "TEXT"
    MARKER = "MARKER"


@dataclass(frozen=True)
class Segment:
    kind: Kind
    value: str


def segmentize(text: str) -> list[Segment]:
    """`text` cut into markers and the text between them (an unclosed opener is text)."""
    out: list[Segment] = []
    opener = ""
    border = 0
    for pos, ch in enumerate(text):
        if not opener and ch in "<[":
            if border < pos:
                out.append(Segment(Kind.TEXT, text[border:pos]))
            border, opener = pos, ch
        elif opener and ch == {"<": ">", "[": "]"}[opener]:
            out.append(Segment(Kind.MARKER, text[border:pos + 1]))
            border, opener = pos + 1, ""
    if border < len(text):
        out.append(Segment(Kind.TEXT, text[border:]))
    return out


def prune_whitespace(segments: list[Segment]) -> list[Segment]:
    return [s for s in segments if trim(s.value)]


@dataclass
class DiffSplit:
    prefix: str = ""
    suffix: str = ""
    left: str = ""
    right: str = ""


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _against_one(result: DiffSplit, one: Segment, many: list[Segment], lo: int,
                 hi: int) -> tuple[int, int, bool]:
    """One segment left on one side, `many[lo:hi + 1]` on the other: the other side's last
    segment joins the suffix where it is that one, else its first the prefix; returns the
    other side's new bounds and whether the one was used."""
    if one == many[hi]:
        result.suffix = many[hi].value + result.suffix
        return lo, hi - 1, True
    if one == many[lo]:
        result.prefix += many[lo].value
        return lo + 1, hi, True
    return lo, hi, False


def diff_split(left: str, right: str) -> DiffSplit:
    """What two renders share at the start and end (whole markers first, then text) and what
    differs between."""
    result = DiffSplit()
    ls, rs = segmentize(left), segmentize(right)
    if not ls:
        result.right = right
        return result
    if not rs:
        result.left = left
        return result
    l0, l1, r0, r1 = 0, len(ls) - 1, 0, len(rs) - 1
    left_done = right_done = False
    while l0 != l1 and r0 != r1:
        advanced = False
        if ls[l0] == rs[r0]:
            result.prefix += ls[l0].value
            l0 += 1
            r0 += 1
            advanced = True
        if ls[l1] == rs[r1]:
            result.suffix = ls[l1].value + result.suffix
            if l0 != l1:
                l1 -= 1
            else:
                left_done = True
            if r0 != r1:
                r1 -= 1
            else:
                right_done = True
            advanced = True
        if not advanced:
            break
    if l0 == l1 and r0 != r1:
        r0, r1, done = _against_one(result, ls[l0], rs, r0, r1)
        left_done |= done
    elif r0 == r1 and l0 != l1:
        l0, l1, done = _against_one(result, rs[r0], ls, l0, l1)
        right_done |= done
    elif l0 == l1 and r0 == r1 and ls[l0] == rs[r0] and ls[l0].kind is Kind.MARKER:
        result.prefix += rs[r0].value
        left_done = right_done = True
    text_suffix = ls[l1].kind is Kind.TEXT and rs[r1].kind is Kind.TEXT
    text_prefix = rs[r0].kind is Kind.TEXT and ls[l0].kind is Kind.TEXT
    rest_left = "".join(s.value for s in ls[l0:l1 if left_done else l1 + 1])
    rest_right = "".join(s.value for s in rs[r0:r1 if right_done else r1 + 1])
    suffix_len = _common_suffix(rest_left, rest_right) if text_suffix else 0
    prefix_len = _common_prefix(rest_left[:len(rest_left) - suffix_len],
                                rest_right[:len(rest_right) - suffix_len]) if text_prefix else 0
    result.prefix += rest_left[:prefix_len]
    result.suffix = rest_left[len(rest_left) - suffix_len:] + result.suffix
    result.left = rest_left[prefix_len:len(rest_left) - suffix_len]
    result.right = rest_right[prefix_len:len(rest_right) - suffix_len]
    if not result.left and not result.right:
        result.prefix, result.suffix = left, ""
    if not result.left and result.right and len(left) <= len(right) and right.startswith(left):
        result.prefix, result.suffix, result.right = left, "", right[len(left):]
    return result


def until_common_prefix(full: str, left: str, right: str) -> str:
    """`full` up to the first place the common prefix of `left` and `right` occurs."""
    n = _common_prefix(left, right)
    pos = full.find(left[:n]) if n else -1
    return full[:pos] if pos >= 0 else ""


def after_common_suffix(full: str, left: str, right: str) -> str:
    """`full` after the last place the common suffix of `left` and `right` occurs."""
    n = _common_suffix(left, right)
    pos = full.rfind(left[len(left) - n:]) if n else -1
    return full[pos + n:] if pos >= 0 else ""


def last_marker(text: str) -> str:
    """The last marker in `text` with whatever non-marker text follows it ("" when none)."""
    found = list(re.finditer(MARKER, text))
    if not found:
        return ""
    return text[found[-1].start():]
