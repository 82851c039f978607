"""llama.cpp's glob (common.cpp `glob_match`): `**` crosses folders, `*` and `?` do not,
`[...]` classes; and server-tools' rule of where a pattern applies: no `/` matches the
basename at any depth, one with `/` the whole relative path (auto-anchored with `**/`)."""

from __future__ import annotations

import posixpath
from functools import cache


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


def glob_match(pattern: str, text: str) -> bool:
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


def path_glob_match(pattern: str, rel_path: str) -> bool:
    if "/" not in pattern:
        return glob_match(pattern, posixpath.basename(rel_path))
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
