"""Tool calls as models write them: JSON shapes and tagged formats, recognised once complete.

`ChatOutputParser` (parsing.py) finds where a tool call starts and ends in a stream; the
functions here turn the complete text of one call block into `ParsedCall`s, or `None` when the
text is not a well-formed call (the parser then keeps it as content).

Formats (as llama.cpp's common/chat.cpp parses them):
- generic JSON: `{"tool_call": {"name", "arguments"}}`, `{"tool_calls": [...]}`, `{"response": ...}`
- plain JSON calls: `{"name": ..., "arguments" | "parameters": {...}}` (Llama 3.x, Hermes without
  tags), OpenAI's `{"type": "function", "function": {...}}`, and arrays of these
- Hermes / Qwen: `<tool_call>{json}</tool_call>` (Qwen3-Coder's XML inside the same tags, and
  the other agent families' blocks: tagged_calls.py)
- Llama 3.1 `<function=NAME>{json}</function>`, and `<|python_tag|>` followed by JSON calls,
  `tool.call(k=v)` or Python code
- Mistral: `[TOOL_CALLS][{...}]` and `[TOOL_CALLS]name[ARGS]{...}` (`[CALL_ID]id` optional)
- DeepSeek R1 / V3: `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

WHITESPACE = " \t\r\n\f\v"
_ID_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase


def partial_suffix(text: str, start: int, markers: Collection[str]) -> int:
    """Length of the longest end of text[start:] that is a proper prefix of one of markers:
    what a streaming parser holds back until the next piece decides."""
    best = 0
    available = len(text) - start
    for marker in markers:
        for size in range(min(len(marker) - 1, available), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def random_string(length: int = 32) -> str:
    """llama-server's `random_string()`: 32 characters of [0-9A-Za-z]."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str | None = None


def dump_arguments(value: Any) -> str:
    """Arguments as compact JSON text, the way llama.cpp dumps them."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _arguments_text(value: Any) -> str | None:
    """Arguments given as an object or as JSON text of an object, as compact JSON text."""
    if isinstance(value, dict):
        return dump_arguments(value)
    if not isinstance(value, str):
        return None
    text = value.strip(WHITESPACE)
    if not text:
        return "{}"
    try:
        parsed = load_json(text)
    except ValueError:
        return None
    return dump_arguments(parsed) if isinstance(parsed, dict) else None


def call_from_object(obj: Any) -> ParsedCall | None:
    """One call from `{"name", "arguments"|"parameters", "id"?}` or OpenAI's nested shape."""
    if not isinstance(obj, dict):
        return None
    call_id = obj.get("id")
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name", obj.get("tool_name"))
    if not isinstance(name, str) or not name.strip(WHITESPACE):
        return None
    for key in ("arguments", "parameters"):
        if key in obj:
            arguments = _arguments_text(obj[key])
            break
    else:
        return None
    if arguments is None:
        return None
    ident = call_id if isinstance(call_id, str) and call_id else None
    return ParsedCall(name=name.strip(WHITESPACE), arguments=arguments, id=ident)


def calls_from_list(items: Any) -> list[ParsedCall] | None:
    if not isinstance(items, list) or not items:
        return None
    calls = [call_from_object(item) for item in items]
    if any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def calls_from_json(value: Any) -> list[ParsedCall] | None:
    """Tool calls in a parsed JSON value, in any of the JSON shapes above (not `response`)."""
    if isinstance(value, list):
        return calls_from_list(value)
    if not isinstance(value, dict):
        return None
    if "tool_calls" in value:
        return calls_from_list(value["tool_calls"])
    if "tool_call" in value:
        call = call_from_object(value["tool_call"])
        return [call] if call else None
    call = call_from_object(value)
    return [call] if call else None


def generic_response(value: Any) -> str | None:
    """The content of the generic format's `{"response": ...}` (llama.cpp dumps non-strings)."""
    if isinstance(value, dict) and len(value) == 1 and "response" in value:
        response = value["response"]
        return response if isinstance(response, str) else json.dumps(response, indent=2)
    return None


def known_names(calls: list[ParsedCall], tool_names: Collection[str] | None) -> bool:
    return tool_names is None or all(call.name in tool_names for call in calls)


def load_json(text: str) -> Any:
    """`json.loads` that tolerates raw control characters in strings; raises ValueError."""
    return json.loads(text, strict=False)


def _json_values(text: str) -> list[Any] | None:
    """One or more JSON values separated by whitespace, `;` or `,` (Llama 3.2 writes `a; b`)."""
    decoder = json.JSONDecoder(strict=False)
    values: list[Any] = []
    pos = 0
    text = text.strip(WHITESPACE)
    while pos < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)
        while pos < len(text) and text[pos] in WHITESPACE + ";,":
            pos += 1
    return values or None


def calls_from_json_text(text: str) -> list[ParsedCall] | None:
    values = _json_values(text)
    if values is None:
        return None
    calls: list[ParsedCall] = []
    for value in values:
        found = calls_from_json(value)
        if found is None:
            return None
        calls.extend(found)
    return calls


def unwrap_value(raw: str) -> str:
    """A parameter's text without the newlines its tags put around it: Qwen3-Coder writes
    `<parameter=K>\nVALUE\n</parameter>` (one newline each side is the markup's), Seed-OSS and
    the others `<…>VALUE</…>` (a trailing newline is the value's own, kept as llama.cpp keeps
    it)."""
    if raw.startswith("\n"):
        return raw[1:].removesuffix("\n")
    return raw


def xml_value(raw: str) -> Any:
    """A parameter value written as text (Qwen3-Coder's XML and its kin, tagged_calls.py): JSON
    when it reads as JSON, otherwise the raw text."""
    text = unwrap_value(raw)
    stripped = text.strip(WHITESPACE)
    looks_like_json = stripped[:1] in ("{", "[", '"', "-") or stripped[:1].isdigit()
    if looks_like_json or stripped in ("true", "false", "null"):
        try:
            return load_json(stripped)
        except ValueError:
            pass
    return text


def parse_function_tag(inner: str) -> list[ParsedCall] | None:
    """Llama 3.1 / functionary: the text after `<function=`, i.e. `NAME>{json}`."""
    name, sep, body = inner.partition(">")
    name = name.strip(WHITESPACE)
    if not sep or not re.fullmatch(r"[\w.\-]+", name):
        return None
    arguments = _arguments_text(body)
    return [ParsedCall(name=name, arguments=arguments)] if arguments else None


_BUILTIN_CALL = re.compile(r"([A-Za-z_][\w]*)\.call\((.*)\)", re.DOTALL)


def parse_python_tag(text: str) -> list[ParsedCall] | None:
    """After Llama 3.1's `<|python_tag|>`: JSON calls, `tool.call(k=v, ...)`, or Python code."""
    body = text.strip(WHITESPACE)
    if not body:
        return None
    if body[0] in "{[":
        return calls_from_json_text(body)
    match = _BUILTIN_CALL.fullmatch(body)
    if match:
        try:
            node = ast.parse(f"f({match.group(2)})", mode="eval").body
            assert isinstance(node, ast.Call) and not node.args
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except (SyntaxError, ValueError, AssertionError):
            pass
        else:
            return [ParsedCall(name=match.group(1), arguments=dump_arguments(kwargs))]
    return [ParsedCall(name="python", arguments=dump_arguments({"code": body}))]


DEEPSEEK_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DEEPSEEK_CALLS_END = "<｜tool▁calls▁end｜>"
_DEEPSEEK_CALL = re.compile(
    r"<｜tool▁call▁begin｜>\s*(?:(?:function)?\s*<｜tool▁sep｜>\s*([^\n`]+?)\s*```(?:json)?\s*(.*?)\s*```"
    r"|([^<\n]+?)\s*<｜tool▁sep｜>\s*(.*?))\s*<｜tool▁call▁end｜>",
    re.DOTALL,
)


def parse_deepseek_calls(inner: str) -> list[ParsedCall] | None:
    """DeepSeek R1 (`function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```) and
    V3.1 (`NAME<｜tool▁sep｜>{…}`)."""
    calls = []
    rest = inner
    for match in _DEEPSEEK_CALL.finditer(inner):
        name = (match.group(1) or match.group(3) or "").strip(WHITESPACE)
        arguments = _arguments_text(match.group(2) if match.group(1) else match.group(4))
        if not name or arguments is None:
            return None
        calls.append(ParsedCall(name=name, arguments=arguments))
        rest = rest.replace(match.group(0), "", 1)
    if not calls or rest.strip(WHITESPACE):
        return None
    return calls


class JsonScanner:
    """Finds where one JSON object or array ends, fed a character at a time; rejects text that
    cannot be the start of JSON, so non-JSON is released as content early."""

    _LITERAL_CHARS = frozenset("0123456789+-.eEtrufalsn")
    _NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.state = "value"
        self.key = False
        self.escape = False
        self.literal = ""
        self.consumed = 0
        self.end: int | None = None  # length of the value once complete
        self.failed = False

    def feed(self, text: str) -> None:
        for ch in text:
            if self.end is not None or self.failed:
                return
            self._step(ch)
            self.consumed += 1
            if not self.stack and self.state == "after" and not self.failed:
                self.end = self.consumed

    def _step(self, ch: str) -> None:
        state = self.state
        if state == "string":
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.state = "colon" if self.key else "after"
            return
        if state == "literal":
            if ch in self._LITERAL_CHARS:
                self.literal += ch
                if not self._literal_prefix_ok(self.literal):
                    self.failed = True
                return
            if not self._literal_ok(self.literal):
                self.failed = True
                return
            self.state = "after"
            state = "after"
        if ch in WHITESPACE:
            return
        if state in ("value", "value_or_end"):
            self._value(ch, closing_allowed=state == "value_or_end")
        elif state in ("key", "key_or_end"):
            if ch == '"':
                self.state, self.key = "string", True
            elif ch == "}" and state == "key_or_end":
                self._close("{")
            else:
                self.failed = True
        elif state == "colon":
            if ch == ":":
                self.state = "value"
            else:
                self.failed = True
        elif state == "after":
            self._after(ch)

    def _value(self, ch: str, *, closing_allowed: bool) -> None:
        if not self.stack and ch not in "{[":
            self.failed = True
        elif ch == "{":
            self.stack.append("{")
            self.state = "key_or_end"
        elif ch == "[":
            self.stack.append("[")
            self.state = "value_or_end"
        elif ch == '"':
            self.state, self.key = "string", False
        elif ch == "]" and closing_allowed:
            self._close("[")
        elif ch in "-0123456789tfn":
            self.state, self.literal = "literal", ch
        else:
            self.failed = True

    def _after(self, ch: str) -> None:
        if ch == "," and self.stack:
            self.state = "key" if self.stack[-1] == "{" else "value"
        elif ch in "}]":
            self._close("{" if ch == "}" else "[")
        else:
            self.failed = True

    def _close(self, opener: str) -> None:
        if not self.stack or self.stack[-1] != opener:
            self.failed = True
            return
        self.stack.pop()
        self.state = "after"

    @classmethod
    def _literal_ok(cls, literal: str) -> bool:
        return literal in ("true", "false", "null") or bool(cls._NUMBER.fullmatch(literal))

    @staticmethod
    def _literal_prefix_ok(literal: str) -> bool:
        if literal[0] in "tfn":
            return any(word.startswith(literal) for word in ("true", "false", "null"))
        return all(c in "0123456789+-.eE" for c in literal)
