"""LFM2's pythonic call list (`[f(a=1, b="x"), g.h(c=[1, 2])]`, family_calls.py) read while it
is still being written, so that each call streams as llama-server streams it (its PEG mapper,
common/chat-peg-parser.cpp: `python_style_tool_calls`): the call's name once its `(` is written,
its arguments `{` with it, each key once its `=` is written, a string value as its text is
written, an integer's digits and a literal's letters as written, other values once they end
(their closing quote or bracket; a `,` or `)` after a number): every prefix of the list gives
the calls llama.cpp's partial parse gives (bench/chat_oracle, checked). The arguments certain
so far are a prefix of what the whole list's reader gives (compact JSON), so the pieces add up
to the whole answer's arguments."""

from __future__ import annotations

import ast
import json
import re

from api.chat.family_calls import _literal
from api.chat.tagged_calls import ParamTypes
from api.chat.tool_formats import WHITESPACE, dump_arguments

Partial = tuple[str, str, str, "str | None"]

_OPEN = re.compile(r"\s*\[?\s*([A-Za-z_][\w.]*)\s*\(")
_NEXT = re.compile(r"\s*,\s*([A-Za-z_][\w.]*)\s*\(")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")
_QUOTES = ("'", '"')


def _value_end(text: str, pos: int) -> int | None:
    """Where the Python literal at `pos` ends (past its closing quote or bracket; at the `,` or
    `)` after a scalar), or None while it may still grow."""
    depth, quote, i = 0, "", pos
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
                if depth == 0:
                    return i + 1
        elif c in _QUOTES:
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


def _open_string(raw: str, quote: str) -> str | None:
    """The text of a string literal still being written (`raw`: after its opening quote), as
    far as it is certain (a half escape sequence held back)."""
    for cut in range(min(len(raw), 10) + 1):
        try:
            value = ast.literal_eval(quote + raw[:len(raw) - cut] + quote)
        except (SyntaxError, ValueError):
            continue
        return value if isinstance(value, str) else None
    return None


_INTEGER = re.compile(r"-?\d*")
_WORDS = {"True": "true", "False": "false", "None": "null",
          "true": "true", "false": "false", "null": "null"}


def _open_scalar(raw: str) -> str:
    """What is certain of a value that is not a string, still being written: the digits of an
    integer, a literal's JSON spelling as far as it is written (`Tr` → `tr`), as llama.cpp
    streams them; nothing of other values until they end (a number's JSON spelling may not
    begin as it is written: `15e-1` is 1.5)."""
    raw = raw.strip(WHITESPACE)
    if _INTEGER.fullmatch(raw):
        return raw
    word = next((json for word, json in _WORDS.items() if raw and word.startswith(raw)), "")
    return word[:len(raw)]


def _arguments(text: str, pos: int) -> tuple[str, str, int | None]:
    """(certain, guessed) arguments of the call whose `(` ends at `pos`, and where its `)`
    ends (None: still open)."""
    arguments: dict[str, object] = {}
    open_value, closer = "", "}"
    while True:
        rest = text[pos:].lstrip(WHITESPACE)
        if rest.startswith(")"):
            dumped = dump_arguments(arguments)
            return dumped, dumped, len(text) - len(rest) + 1
        key = _KEY.match(text, pos)
        if key is None:
            break
        start = key.end()
        end = _value_end(text, start)
        if end is None:  # the key once its `=` is written, then the value as far as it goes
            quote = text[start:start + 1]
            partial = _open_string(text[start + 1:], quote) if quote in _QUOTES else None
            encoded = json.dumps(partial, ensure_ascii=False)[:-1] if partial is not None \
                else _open_scalar(text[start:])
            open_value = f"{json.dumps(key.group(1), ensure_ascii=False)}:{encoded}"
            closer = '"}' if partial is not None else "}" if encoded.strip("-") else "null}"
            break
        try:
            arguments[key.group(1)] = _literal(
                ast.parse(text[start:end].strip(WHITESPACE), mode="eval").body)
        except (SyntaxError, ValueError):
            break
        pos = end
        rest = text[pos:].lstrip(WHITESPACE)
        if rest.startswith(","):
            pos = len(text) - len(rest) + 1
        elif not rest.startswith(")"):
            break
    dumped = dump_arguments(arguments)
    certain = dumped[:-1] + ("," if arguments and open_value else "") + open_value
    return certain, certain + closer, None


def pythonic_calls(inner: str, _types: ParamTypes) -> list[Partial]:
    """Each call of LFM2's list begun so far (those before the last whole): (name, the
    arguments certain so far, the arguments guessed whole, None)."""
    found: list[Partial] = []
    opened = _OPEN.match(inner)
    while opened is not None:
        certain, guess, end = _arguments(inner, opened.end())
        found.append((opened.group(1), certain, guess, None))
        if end is None:
            break
        opened = _NEXT.match(inner, end)
    return found
