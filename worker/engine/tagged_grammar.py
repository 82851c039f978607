"""The grammar of a forced call's arguments written as tagged `KEY`/`VALUE` pairs (Hy3's
`<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n`, a template llama.cpp's auto-parser reads
in TAG_WITH_TAGGED mode), as llama.cpp's grammar writes them (common/
chat-auto-parser-generator.cpp `build_tool_parser_tag_tagged`): the required parameters in
the schema's order, then the optional ones in any order, any number of times; each parameter
its key's markers, its name, its value's markers, then a value: any text without the value's
closing marker where the parameter may be a string, else the JSON value its schema allows;
whitespace between the pairs. An alternative of the forced call's schema asks for this with
its `TAGGED` key: [key prefix, what is between the key and the value, the value's closing
marker] (api/chat/autoparse/forced.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

TAGGED = "x-llamaq-tagged-arguments"
SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
"""The whitespace between pairs: json-schema-to-grammar's `space`, as llama.cpp's grammar
writes its `space` (bounded: a model cannot spin in it)."""


def gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped.replace("\r", "\\r").replace("\t", "\\t") + '"'


def _char_class(chars: list[str], negate: bool) -> str:
    escaped = "".join("\\" + c if c in "^]-[\\" else
                      {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, c) for c in chars)
    return ("[^" if negate else "[") + escaped + "]"


def excluding(name: str, marker: str) -> list[str]:
    """The rules of `name`: any text that does not contain `marker` (the complement of its
    KMP automaton, as llama.cpp's `gbnf_excluding_grammar`); every state accepts, a character
    that would complete the marker has no alternative."""
    def next_state(q: int, c: str) -> int:
        while True:
            if marker[q] == c:
                return q + 1
            if q == 0:
                return 0
            q = fail[q - 1]
    fail = [0] * len(marker)  # the longest proper border of marker[:i + 1]
    for i in range(1, len(marker)):
        k = fail[i - 1]
        while k and marker[i] != marker[k]:
            k = fail[k - 1]
        fail[i] = k + 1 if marker[i] == marker[k] else 0
    alphabet = sorted(set(marker))

    def state(q: int) -> str:
        return name if q == 0 else f"{name}-{q:02d}"
    rules = []
    for q in range(len(marker)):
        buckets: dict[int, list[str]] = {}
        specific = []
        for c in alphabet:
            d = next_state(q, c)
            if d == len(marker):
                specific.append(c)
            elif d:
                buckets.setdefault(d, []).append(c)
                specific.append(c)
        rhs = "|" + "".join(f" {_char_class(chars, False)} {state(d)} |"
                            for d, chars in sorted(buckets.items()))
        rules.append(f"{state(q)} ::= {rhs} {_char_class(specific, True)} {state(0)}")
    return rules


def may_be_string(schema: object) -> bool:
    """Whether a parameter's schema allows a string (llama.cpp's `may_be_string`)."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    if "const" in schema:
        return isinstance(schema["const"], str)
    if isinstance(schema.get("enum"), list):
        return any(isinstance(v, str) for v in schema["enum"])
    return any(may_be_string(s) for key in ("anyOf", "oneOf")
               for s in schema.get(key) or [])


def tagged_arguments(schema: Mapping[str, Any], prefix: str,
                     renamed: Callable[[str, str], str]) -> list[str]:
    """The rules of `prefix + "root"`: `schema`'s properties as tagged pairs (the markers in its
    TAGGED key); `renamed(grammar, prefix)` renames a value's grammar's rules apart."""
    key_prefix, between, value_end = schema[TAGGED]
    until = f"{prefix}until"
    rules: list[str] = []
    required: list[str] = []
    optional: list[str] = []
    for j, (name, param) in enumerate(dict(schema.get("properties") or {}).items()):
        if may_be_string(param):
            if not any(rule.startswith(f"{until} ::=") for rule in rules):
                rules.extend(excluding(until, value_end))
            value = until
        else:
            grammar = str(json_schema_to_gbnf(json.dumps(param, ensure_ascii=False)))
            rules.append(renamed(grammar, f"{prefix}a{j}-"))
            value = f"{prefix}a{j}-root"
        rules.append(f"{prefix}arg{j} ::= {gbnf_literal(key_prefix + name + between)} {value} "
                     f"{gbnf_literal(value_end)}")
        (required if name in (schema.get("required") or []) else optional).append(
            f"{prefix}arg{j}")
    space = f"{prefix}space"
    sequence = f" {space} ".join(required)
    if optional:
        sequence += f" ({space} ({' | '.join(optional)}))*"
    rules.append(f"{space} ::= {SPACE}")
    rules.append(f"{prefix}root ::= {space} {sequence} {space}")
    return rules
