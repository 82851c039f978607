"""Issue 43 item 4, the parts: llama.cpp's glob run as a set of positions (the same answers
as the backtracking it replaces, no recursion, a deadline), grep's matching under a time
budget with the GIL released, and reads bounded by the bytes read with devices and FIFOs
refused."""

from __future__ import annotations

import os
import threading
import time
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.tools.builtin.grep_scan import (
    GREP_MAX_RESULTS,
    GrepState,
    compile_pattern,
    report,
    scan,
)
from api.tools.builtin.read_write import split_lines
from api.tools.glob_match import GlobTimeout, _class_match, filter_paths, glob_match
from api.tools.host_files import read_regular, write_regular
from api.tools.tools_io import FileRefused


def backtracking_glob(pattern: str, text: str) -> bool:
    """llama.cpp's recursion (common.cpp `glob_match`), the reference."""
    @cache
    def match(p: int, s: int) -> bool:
        if p == len(pattern):
            return s == len(text)
        if pattern.startswith("**", p):
            return match(p + 2, s) or (s < len(text) and match(p, s + 1))
        ch = pattern[p]
        if ch == "*":
            while s < len(text) and text[s] != "/":
                if match(p + 1, s):
                    return True
                s += 1
            return match(p + 1, s)
        if ch == "?":
            return s < len(text) and text[s] != "/" and match(p + 1, s + 1)
        if ch == "[":
            end = p + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end < len(pattern):
                return (s < len(text) and _class_match(text[s], pattern[p + 1:end])
                        and match(end + 1, s + 1))
            return s < len(text) and text[s] == "[" and match(p + 1, s + 1)
        return s < len(text) and ch == text[s] and match(p + 1, s + 1)

    return match(0, 0)


@settings(max_examples=600, deadline=None)
@given(st.text("ab/*?[]!-", max_size=10), st.text("ab/[]!-", max_size=10))
def test_glob_answers_as_the_backtracking_does(pattern: str, text: str) -> None:
    assert glob_match(pattern, text) == backtracking_glob(pattern, text)


def test_a_long_glob_neither_recurses_nor_runs_on() -> None:
    assert glob_match("a" * 5000, "a" * 5000)  # RecursionError with the recursion
    assert glob_match("*a" * 2000, "a" * 4000)
    with pytest.raises(GlobTimeout):
        glob_match("*" * 10, "x", deadline=time.monotonic() - 1)
    kept, cut = filter_paths(["a.py", "b.txt", "c.py"], "*.py", "", time.monotonic() + 5)
    assert (kept, cut) == ([0, 2], False)
    assert filter_paths(["a"], "*", "", time.monotonic() - 1) == ([], True)


def listed_grep(source: str, text: str, ctx: int, show_num: bool, total: int
                ) -> tuple[list[str], int, bool]:
    """llama-server's grep loop over the file's whole list of lines, the reference."""
    pattern = compile_pattern(source, literal=False, ignore_case=False)
    lines, out, limit = split_lines(text), [], False
    for i, line in enumerate(lines):
        if total >= GREP_MAX_RESULTS:
            limit = True
            break
        if not pattern.search(line):
            continue
        lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx else (i, i)
        for j in range(lo, hi + 1):
            mark = ":" if j == i else "-"
            out.append(f"f{mark}{f'{j + 1}{mark}' if show_num else ''}{lines[j]}\n")
        if ctx:
            out.append("--\n")
        total += 1
    return out, total, limit


@settings(max_examples=600, deadline=None)
@given(st.text("ab\n", max_size=40), st.sampled_from(["a", "b+", "^a", "ab$", "x"]),
       st.integers(0, 3), st.booleans(), st.sampled_from([0, 97, 99, 100]))
def test_grep_reads_lines_lazily_with_the_same_answers(text: str, source: str, ctx: int,
                                                       show_num: bool, total: int) -> None:
    state = GrepState(total=total)
    scan(compile_pattern(source, literal=False, ignore_case=False), text.encode(), "f", ctx,
         show_num, state, time.monotonic() + 60)
    assert (state.out, state.total, state.limit_reached) == \
        listed_grep(source, text, ctx, show_num, total)


@pytest.mark.serial  # GIL ticks under 100 ms: alone (tests/lanes.py)
def test_a_catastrophic_regex_ends_at_the_budget_without_holding_the_gil() -> None:
    pattern = compile_pattern("(a|aa)+$", literal=False, ignore_case=False)
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            ticks.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    state = GrepState()
    started = time.monotonic()
    try:
        scan(pattern, b"a" * 5000 + b"!\n", "f", 0, False, state, time.monotonic() + 0.5)
    finally:
        stop.set()
        ticker.join()
    assert state.timed_out and time.monotonic() - started < 3
    assert "time budget" in report(state)
    assert max(ticks) < 0.1, f"the search held the GIL {max(ticks) * 1000:.0f} ms"


def test_reads_are_bounded_by_bytes_read_and_refuse_special_files(tmp_path: Path) -> None:
    with pytest.raises(FileRefused, match="not a regular file: /dev/zero"):
        read_regular("/dev/zero", "/dev/zero", 1024)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file"):  # no writer: must not wait
        read_regular(str(tmp_path / "fifo"), "fifo", 1024)
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert read_regular(str(tmp_path / "f"), "f", 10) == b"x" * 10
    with pytest.raises(FileRefused, match=r"file too large \(more than 9 bytes\): f"):
        read_regular(str(tmp_path / "f"), "f", 9)
    assert read_regular(str(tmp_path / "missing"), "missing", 9) is None


def test_writes_refuse_special_files(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert not write_regular(str(tmp_path / "fifo"), "fifo", b"x")  # no reader: no wait
    with pytest.raises(FileRefused, match="not a regular file: /dev/null"):
        write_regular("/dev/null", "/dev/null", b"x")
    (tmp_path / "f").write_bytes(b"longer content")
    assert write_regular(str(tmp_path / "f"), "f", b"short")
    assert (tmp_path / "f").read_bytes() == b"short"
    assert read_regular(str(tmp_path), "dir", 10) is None  # a folder: cannot be opened
