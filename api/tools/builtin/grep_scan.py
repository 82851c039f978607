"""grep_search's matching, off the event loop and under a deadline: the pattern is the `regex`
package's (Python's `re` syntax), searched with `timeout=` and `concurrent=True` (the GIL is
released while it runs), so a catastrophic pattern (`(a|aa)+$` against a long line) ends at
the search's time budget and never holds the pod's event loop or its other threads. Ours:
llama-server runs std::regex with no limit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import regex

from api.tools.builtin.read_write import split_lines

GREP_MAX_RESULTS = 100
GREP_TIMEOUT_S = 15.0
"""The whole search's time budget: listing, filtering, reading and matching."""


class BadPattern(Exception):
    """The pattern does not compile (the tool's `invalid regex: ...`)."""


def compile_pattern(source: str, literal: bool, ignore_case: bool) -> regex.Pattern[str]:
    if literal:
        source = regex.escape(source)
    flags = regex.VERSION0 | (regex.IGNORECASE if ignore_case else 0)
    try:
        return regex.compile(source, flags)
    except (regex.error, OverflowError, RecursionError) as exc:
        raise BadPattern(f"invalid regex: {exc}") from None


@dataclass
class GrepState:
    out: list[str] = field(default_factory=list)
    total: int = 0
    limit_reached: bool = False
    timed_out: bool = False

    @property
    def done(self) -> bool:
        return self.limit_reached or self.timed_out


def scan(pattern: regex.Pattern[str], data: bytes, shown: str, ctx: int, show_num: bool,
         state: GrepState, deadline: float) -> None:
    """One file's matching lines into `state`, as llama-server prints them."""
    lines = split_lines(data.decode("utf-8", "replace"))
    for i, line in enumerate(lines):
        if state.total >= GREP_MAX_RESULTS:
            state.limit_reached = True
            return
        left = deadline - time.monotonic()
        if left <= 0:
            state.timed_out = True
            return
        try:
            found = pattern.search(line, timeout=left, concurrent=True)
        except TimeoutError:
            state.timed_out = True
            return
        if not found:
            continue
        lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx else (i, i)
        for j in range(lo, hi + 1):
            mark = ":" if j == i else "-"
            num = f"{j + 1}{mark}" if show_num else ""
            state.out.append(f"{shown}{mark}{num}{lines[j]}\n")
        if ctx:
            state.out.append("--\n")
        state.total += 1


def report(state: GrepState) -> str:
    text = "".join(state.out) + f"\n---\nTotal matches: {state.total}\n"
    if state.limit_reached:
        text += (f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the "
                 "path/pattern/include to see more.]\n")
    if state.timed_out:
        text += (f"[search stopped: its time budget ({GREP_TIMEOUT_S:g} s) ran out. Narrow the "
                 "path/pattern/include, or simplify the pattern.]\n")
    return text
