"""llama.cpp's glob (common.cpp `glob_match`): `**` crosses folders, `*` and `?` do not,
`[...]` classes; and server-tools' rule of where a pattern applies: no `/` matches the
basename at any depth, one with `/` the whole relative path (auto-anchored with `**/`).

llama.cpp matches by backtracking; here a pattern is compiled once into tokens and run as a
set of text positions, token by token: time is at most (tokens x text length), with no
recursion (a long pattern cannot overflow the stack), and a deadline stops it (`GlobTimeout`).
Callers on the event loop run it in a thread (`filter_paths`)."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from enum import Enum


class GlobTimeout(Exception):
    """The deadline passed before the matching ended."""


class Op(Enum):
    LIT = 1
    ANY = 2  # ?
    STAR = 3  # *: within one path component
    DSTAR = 4  # **: across components
    CLASS = 5


@dataclass(frozen=True)
class Token:
    op: Op
    text: str = ""  # LIT: the character; CLASS: the body between the brackets


def _class_match(c: str, body: str) -> bool:
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    if body[:1] in ("]", "-"):  # first after the negation: a literal
        if body[0] == c:
            return not negated
        body = body[1:]
    matched = False
    i = 0
    while i < len(body) and not matched:
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "]":
            matched = body[i] <= c <= body[i + 2]
            i += 3
        else:
            matched = body[i] == c
            i += 1
    return matched != negated


def compile_glob(pattern: str) -> list[Token]:
    tokens: list[Token] = []
    p = 0
    while p < len(pattern):
        if pattern.startswith("**", p):
            tokens.append(Token(Op.DSTAR))
            p += 2
            continue
        ch = pattern[p]
        if ch == "*":
            tokens.append(Token(Op.STAR))
        elif ch == "?":
            tokens.append(Token(Op.ANY))
        elif ch == "[":
            end = p + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end < len(pattern):
                tokens.append(Token(Op.CLASS, pattern[p + 1:end]))
                p = end + 1
                continue
            tokens.append(Token(Op.LIT, "["))  # unclosed: a literal bracket
        else:
            tokens.append(Token(Op.LIT, ch))
        p += 1
    return tokens


def _step(tok: Token, text: str, at: set[int]) -> set[int]:
    n = len(text)
    if tok.op is Op.DSTAR:
        return set(range(min(at), n + 1))
    if tok.op is Op.STAR:
        out: set[int] = set()
        for s in sorted(at):
            if s in out:
                continue
            out.add(s)
            while s < n and text[s] != "/":
                s += 1
                out.add(s)
        return out
    if tok.op is Op.LIT:
        return {s + 1 for s in at if s < n and text[s] == tok.text}
    if tok.op is Op.ANY:
        return {s + 1 for s in at if s < n and text[s] != "/"}
    return {s + 1 for s in at if s < n and _class_match(text[s], tok.text)}


def match_tokens(tokens: list[Token], text: str, deadline: float | None = None) -> bool:
    at = {0}
    for tok in tokens:
        if deadline is not None and time.monotonic() >= deadline:
            raise GlobTimeout
        at = _step(tok, text, at)
        if not at:
            return False
    return len(text) in at


def glob_match(pattern: str, text: str, deadline: float | None = None) -> bool:
    return match_tokens(compile_glob(pattern), text, deadline)


class PathGlob:
    """A file_glob_search/grep_search `include` or `exclude`, compiled once for a listing."""

    def __init__(self, pattern: str) -> None:
        self.basename_only = "/" not in pattern
        if not self.basename_only and not (pattern == "**" or pattern.startswith("**/")
                                           or pattern.startswith("/")):
            pattern = "**/" + pattern
        self.tokens = compile_glob(pattern)

    def match(self, rel_path: str, deadline: float | None = None) -> bool:
        text = posixpath.basename(rel_path) if self.basename_only else rel_path
        return match_tokens(self.tokens, text, deadline)


def path_glob_match(pattern: str, rel_path: str) -> bool:
    return PathGlob(pattern).match(rel_path)


def filter_paths(paths: list[str], include: str, exclude: str, deadline: float
                 ) -> tuple[list[int], bool]:
    """The indexes of `paths` that `include` matches and `exclude` (when not empty) does not;
    True beside them when the deadline cut the filtering short."""
    inc = PathGlob(include)
    exc = PathGlob(exclude) if exclude else None
    kept: list[int] = []
    try:
        for i, rel in enumerate(paths):
            if inc.match(rel, deadline) and not (exc and exc.match(rel, deadline)):
                kept.append(i)
    except GlobTimeout:
        return kept, True
    return kept, False
