"""grep_search's matching, off the event loop and under a deadline: the pattern is the `regex`
package's (Python's `re` syntax), searched with `timeout=` and `concurrent=True` (the GIL is
released while it runs), so a catastrophic pattern (`(a|aa)+$` against a long line) ends at
the search's time budget and never holds the pod's event loop or its other threads. Ours:
llama-server runs std::regex with no limit."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api.tools.builtin.read_write import iter_lines

if TYPE_CHECKING:
    import regex

GREP_MAX_RESULTS = 100
GREP_TIMEOUT_S = 15.0
"""The whole search's time budget: listing, filtering, reading and matching."""


class BadPattern(Exception):
    """The pattern does not compile (the tool's `invalid regex: ...`)."""


def compile_pattern(source: str, literal: bool, ignore_case: bool) -> regex.Pattern[str]:
    # imported here, not at the top: the regex package costs an api pod ~12 ms of CPU at start,
    # and only a grep_search call needs it
    import regex

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


@dataclass
class _Block:
    """A match and its context lines, printed once its `ctx` lines after have been read."""

    at: int  # the match's line, 0-based
    first: int  # the line of lines[0]
    lines: list[str]


def _emit(block: _Block, shown: str, show_num: bool, ctx: int, state: GrepState) -> None:
    for k, line in enumerate(block.lines):
        j = block.first + k
        mark = ":" if j == block.at else "-"
        num = f"{j + 1}{mark}" if show_num else ""
        state.out.append(f"{shown}{mark}{num}{line}\n")
    if ctx:
        state.out.append("--\n")


def _matches(pattern: regex.Pattern[str], line: str, state: GrepState, deadline: float
             ) -> bool:
    left = deadline - time.monotonic()
    try:
        if left > 0:
            return pattern.search(line, timeout=left, concurrent=True) is not None
    except TimeoutError:
        pass
    state.timed_out = True
    return False


def scan(pattern: regex.Pattern[str], data: bytes, shown: str, ctx: int, show_num: bool,
         state: GrepState, deadline: float) -> None:
    """One file's matching lines into `state`, as llama-server prints them; its lines read
    lazily (a window of `ctx` lines before, the blocks waiting for their lines after)."""
    before: deque[str] = deque(maxlen=ctx)
    pending: deque[_Block] = deque()
    for i, line in enumerate(iter_lines(data)):
        for block in pending:
            block.lines.append(line)
        while pending and pending[0].at + ctx <= i:
            _emit(pending.popleft(), shown, show_num, ctx, state)
        if state.done:
            if not pending:
                return
        elif state.total >= GREP_MAX_RESULTS:
            state.limit_reached = True
        elif _matches(pattern, line, state, deadline):
            block = _Block(i, i - len(before), [*before, line])
            state.total += 1
            if ctx:
                pending.append(block)
            else:
                _emit(block, shown, show_num, ctx, state)
        if ctx:
            before.append(line)
    for block in pending:  # the file ended before their lines after
        _emit(block, shown, show_num, ctx, state)


def report(state: GrepState) -> str:
    text = "".join(state.out) + f"\n---\nTotal matches: {state.total}\n"
    if state.limit_reached:
        text += (f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the "
                 "path/pattern/include to see more.]\n")
    if state.timed_out:
        text += (f"[search stopped: its time budget ({GREP_TIMEOUT_S:g} s) ran out. Narrow the "
                 "path/pattern/include, or simplify the pattern.]\n")
    return text
