"""Tool calls of the newer agent families (llama.cpp's common/parsers/*.cpp), turned from the
complete text of one block into `ParsedCall`s, or `None` when the text is not a well-formed
call (it then stays content). chat_formats.py says which template writes which:

- LFM2 / LFM2.5: `<|tool_call_start|>[name(k=v, …), …]<|tool_call_end|>` (Python-style calls,
  dotted names, Python or JSON literals)
- Gemma 4: `<|tool_call>call:NAME{k:v,…}<tool_call|>` (strings quoted `<|"|>…<|"|>`, keys bare)
- DeepSeek V3.2 / V4 (DSML): `<｜DSML｜function_calls>` (V4: `tool_calls`) of
  `<｜DSML｜invoke name="N"><｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`
- MiniMax-M3: `<tool_call>` of `<invoke name="N"><K>V</K></invoke>`, each tag after the
  `]<]minimax[>[` namespace token
- MiniCPM 5: `<function name="N"><param name="K">V</param></function>`
- Nemotron-Nano-v2 `<TOOLCALL>[json]</TOOLCALL>`, Apriel `<tool_calls>[json]</tool_calls>`
  (their blocks: listed_calls.py), Apertus `<|tools_prefix|>[{"NAME": {args}}]<|tools_suffix|>`,
  GigaChat 3 `function call<|role_sep|>\\n{json}` to the end of the answer
"""

from __future__ import annotations

import ast
import re
from typing import Any

from api.chat.tagged_calls import ParamTypes, typed_value
from api.chat.tool_formats import (
    WHITESPACE,
    ParsedCall,
    calls_from_json_text,
    dump_arguments,
    load_json,
)

# --- LFM2: Python-style calls ----------------------------------------------------------------

_LITERAL_NAMES = {"True": True, "False": False, "None": None,
                  "true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    """A Python (or JSON) literal's value; ValueError for anything else."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, bytes):
        return node.value
    if isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
        return _LITERAL_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                raise ValueError("** in a dict")
            out[str(_literal(key))] = _literal(value)
        return out
    raise ValueError(f"not a literal: {ast.dump(node)[:40]}")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("not a name")


def parse_pythonic_calls(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of LFM2's `<|tool_call_start|>…<|tool_call_end|>`: `[f(a=1), g.h(b="x")]`."""
    text = inner.strip(WHITESPACE)
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for item in items:
        if not isinstance(item, ast.Call) or item.args:
            return None
        try:
            name = _dotted(item.func)
            arguments = {kw.arg: _literal(kw.value) for kw in item.keywords if kw.arg}
        except ValueError:
            return None
        if len(arguments) != len(item.keywords):
            return None
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    return calls or None


# --- Gemma 4 ---------------------------------------------------------------------------------

GEMMA4_QUOTE = '<|"|>'
_GEMMA4_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


class _Gemma4Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in WHITESPACE:
            self.pos += 1

    def take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def value(self) -> Any:
        self.space()
        if self.take(GEMMA4_QUOTE):
            end = self.text.find(GEMMA4_QUOTE, self.pos)
            if end < 0:
                raise ValueError("unclosed string")
            value, self.pos = self.text[self.pos:end], end + len(GEMMA4_QUOTE)
            return value
        if self.text.startswith("{", self.pos):
            return self.dict()
        if self.take("["):
            items: list[Any] = []
            self.space()
            if self.take("]"):
                return items
            while True:
                items.append(self.value())
                self.space()
                if self.take("]"):
                    return items
                if not self.take(","):
                    raise ValueError("expected , or ]")
        for word, literal in (("true", True), ("false", False), ("null", None)):
            if self.take(word):
                return literal
        match = _GEMMA4_NUMBER.match(self.text, self.pos)
        if not match:
            raise ValueError("not a value")
        self.pos = match.end()
        return load_json(match.group(0))

    def dict(self) -> dict[str, Any]:
        if not self.take("{"):
            raise ValueError("expected {")
        out: dict[str, Any] = {}
        self.space()
        if self.take("}"):
            return out
        while True:
            self.space()
            colon = self.text.find(":", self.pos)
            key = self.text[self.pos:colon] if colon >= 0 else ""
            if not key or "}" in key:
                raise ValueError("expected key")
            self.pos = colon + 1
            out[key] = self.value()
            self.space()
            if self.take("}"):
                return out
            if not self.take(","):
                raise ValueError("expected , or }")


def parse_gemma4_call(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of Gemma 4's `<|tool_call>…<tool_call|>`: `call:NAME{…}`."""
    if not inner.startswith("call:"):
        return None
    brace = inner.find("{")
    name = inner[len("call:"):brace].strip(WHITESPACE) if brace > 0 else ""
    if not name:
        return None
    reader = _Gemma4Reader(inner[brace:])
    try:
        arguments = reader.dict()
    except ValueError:
        return None
    reader.space()
    if reader.pos != len(reader.text):
        return None
    return [ParsedCall(name=name, arguments=dump_arguments(arguments))]


# --- XML-like invokes (DSML, MiniMax-M3, MiniCPM 5) ------------------------------------------

DSML = "｜DSML｜"
_DSML_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]+)">(.*?)</{DSML}invoke>', re.DOTALL)
_DSML_PARAM = re.compile(
    rf'<{DSML}parameter name="([^"]+)"(?: string="(true|false)")?>(.*?)</{DSML}parameter>',
    re.DOTALL)


def _leftover(text: str, pattern: re.Pattern[str]) -> bool:
    return bool(pattern.sub("", text).strip(WHITESPACE))


def parse_dsml_calls(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of DeepSeek V3.2/V4's DSML calls block: `string="true"` values are text,
    the others JSON."""
    calls = []
    for invoke in _DSML_INVOKE.finditer(inner):
        name = invoke.group(1).strip(WHITESPACE)
        body = invoke.group(2)
        if _leftover(body, _DSML_PARAM):
            return None
        arguments = dsml_arguments(name, _DSML_PARAM.findall(body), types)
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    if not calls or _leftover(inner, _DSML_INVOKE):
        return None
    return calls


def dsml_arguments(name: str, params: list[tuple[str, str, str]],
                   types: ParamTypes) -> dict[str, Any]:
    """DSML (key, string flag, raw value) parameters: `string="true"` text, the others JSON."""
    arguments: dict[str, Any] = {}
    for key, is_string, raw in params:
        try:
            arguments[key] = raw if is_string == "true" else load_json(raw.strip(WHITESPACE))
        except ValueError:
            arguments[key] = typed_value(raw, types.get(name, {}).get(key))
    return arguments


MINIMAX_M3_NS = "]<]minimax[>["
_M3_INVOKE = re.compile(re.escape(MINIMAX_M3_NS) + r'<invoke name="([^"]+)">(.*?)' +
                        re.escape(MINIMAX_M3_NS) + "</invoke>", re.DOTALL)
_M3_OPEN = re.compile(re.escape(MINIMAX_M3_NS) + r"<([^<>/\s]+)>")


def _m3_children(text: str) -> list[tuple[str, str]] | None:
    """The `NS<tag>…NS</tag>` elements `text` is made of (nested ones kept whole), or None
    when it is not only elements."""
    out = []
    pos = 0
    while pos < len(text):
        if not text[pos:].strip(WHITESPACE):
            break
        match = _M3_OPEN.match(text, pos + len(text[pos:]) - len(text[pos:].lstrip(WHITESPACE)))
        if not match:
            return None
        tag = match.group(1)
        opener, closer = f"{MINIMAX_M3_NS}<{tag}>", f"{MINIMAX_M3_NS}</{tag}>"
        depth, at = 1, match.end()
        while depth:
            next_close = text.find(closer, at)
            if next_close < 0:
                return None
            next_open = text.find(opener, at, next_close)
            if next_open >= 0:
                depth, at = depth + 1, next_open + len(opener)
            else:
                depth, at = depth - 1, next_close + len(closer)
        out.append((tag, text[match.end():at - len(closer)]))
        pos = at
    return out


def _m3_value(raw: str, schema_type: Any) -> Any:
    """A MiniMax-M3 parameter's value: a string parameter its text as written (markup and
    all), a nested object or array its elements (`<item>` for an array's), else a scalar."""
    if schema_type == "string" or (isinstance(schema_type, list) and "string" in schema_type):
        return raw
    children = _m3_children(raw) if MINIMAX_M3_NS in raw else None
    if children:
        if all(tag == "item" for tag, _ in children):
            return [_m3_value(inner, None) for _, inner in children]
        return {tag: _m3_value(inner, None) for tag, inner in children}
    return typed_value(raw.replace(MINIMAX_M3_NS, ""), schema_type)


def parse_minimax_m3_calls(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of MiniMax-M3's `<tool_call>…</tool_call>`, namespace tokens and all."""
    calls = []
    for invoke in _M3_INVOKE.finditer(inner):
        name = invoke.group(1).strip(WHITESPACE)
        params = _m3_children(invoke.group(2))
        if params is None:
            return None
        known = types.get(name, {})
        arguments = {key: _m3_value(value, known.get(key)) for key, value in params}
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    if not calls or _leftover(inner.replace(MINIMAX_M3_NS, ""), _M3_PLAIN_INVOKE):
        return None
    return calls


_M3_PLAIN_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
_CPM_PARAM = re.compile(
    r'<param name="([^"]+)">(?:<!\[CDATA\[(.*?)\]\]>|(?!<!\[CDATA\[)(.*?))</param>', re.DOTALL)
"""A parameter; a CDATA value is its inner text (it may hold `</param>`)."""


def parse_minicpm5_call(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The text after MiniCPM 5's `<function name="`: `NAME"><param name="K">V</param>…`."""
    name, sep, body = inner.partition('">')
    name = name.strip(WHITESPACE)
    if not sep or not name or '"' in name or _leftover(body, _CPM_PARAM):
        return None
    known = types.get(name, {})
    arguments = {key: typed_value(cdata or value, known.get(key))
                 for key, cdata, value in _CPM_PARAM.findall(body)}
    return [ParsedCall(name=name, arguments=dump_arguments(arguments))]


# --- JSON in a family's tags -----------------------------------------------------------------

def parse_json_calls(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """A JSON list (or object) of `{"name", "arguments"}` calls."""
    return calls_from_json_text(inner)


def parse_functools(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """What follows Firefunction v2's `functools[`: the rest of a JSON list of calls."""
    return calls_from_json_text("[" + inner)


def parse_apertus_calls(inner: str, _types: ParamTypes) -> list[ParsedCall] | None:
    """Apertus: `[{"NAME": {arguments}}, …]`."""
    try:
        value = load_json(inner.strip(WHITESPACE))
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or len(item) != 1:
            return None
        (name, arguments), = item.items()
        if not isinstance(arguments, dict):
            return None
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    return calls or None


# --- Kimi K3 ---------------------------------------------------------------------------------

K3_SEP = "<|sep|>"
_K3_CALL = re.compile(r'<\|open\|>call tool="([^"]+)"[^<]*?<\|sep\|>(.*?)<\|close\|>call<\|sep\|>',
                      re.DOTALL)
_K3_ARG = re.compile(r'<\|open\|>argument key="([^"]+)"[^<]*?<\|sep\|>(.*?)'
                     r"<\|close\|>argument<\|sep\|>", re.DOTALL)


def parse_kimi_k3_tools(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The inside of Kimi K3's `<|open|>tools<|sep|>…<|close|>tools<|sep|>`: calls of
    `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>` (typed by the tool's
    schema: a string parameter is its text, anything else JSON)."""
    calls = []
    for call in _K3_CALL.finditer(inner):
        name = call.group(1)
        if _leftover(call.group(2), _K3_ARG):
            return None
        known = types.get(name, {})
        arguments: dict[str, Any] = {}
        for key, raw in _K3_ARG.findall(call.group(2)):
            if known.get(key, "string") == "string":
                arguments[key] = raw
                continue
            try:
                arguments[key] = load_json(raw.strip(WHITESPACE))
            except ValueError:
                arguments[key] = raw
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    if not calls or _leftover(inner, _K3_CALL):
        return None
    return calls


# --- Muse Glimmer ----------------------------------------------------------------------------

_ATEM_INVOKE = re.compile(r'<atem:invoke name="([^"]+)">(.*?)</atem:invoke>', re.DOTALL)
_ATEM_PARAM = re.compile(r'<atem:parameter name="([^"]+)">(.*?)</atem:parameter>', re.DOTALL)


def parse_muse_call(inner: str, types: ParamTypes) -> list[ParsedCall] | None:
    """The text after Muse Glimmer's `to=`: `TOOL<|message|><atem:function_calls>` and its
    invokes (a message to `user` or `self` is no call)."""
    recipient, sep, body = inner.partition("<|message|>")
    recipient = recipient.strip(WHITESPACE)
    body = body.strip(WHITESPACE)
    if not sep or recipient in ("user", "self") or not body.startswith("<atem:function_calls>"):
        return None
    body = body[len("<atem:function_calls>"):]
    calls = []
    for invoke in _ATEM_INVOKE.finditer(body):
        name = invoke.group(1)
        if _leftover(invoke.group(2), _ATEM_PARAM):
            return None
        known = types.get(name, {})
        arguments = {key: typed_value(value, known.get(key))
                     for key, value in _ATEM_PARAM.findall(invoke.group(2))}
        calls.append(ParsedCall(name=name, arguments=dump_arguments(arguments)))
    if not calls or _leftover(body, _ATEM_INVOKE):
        return None
    return calls
