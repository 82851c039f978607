"""The grammar of a forced tool call in the template's own markers (the job's
`json_schema_frame`, api/chat/tool_grammar.py `native_tool_call`): the JSON schema's value
written between the frame's prefix and suffix, the block repeated after its separator when it
has one. With entries past the third, the schema is an `anyOf` with one alternative per
function, and each is written after its own markers (the function's name in them, as
llama.cpp's grammar for an auto-parsed template offers each function: common/
chat-auto-parser-generator.cpp `build_tool_parser_tag_json`): each alternative's grammar is
converted on its own, its rules renamed apart (`f0-…`, `f1-…`); an alternative whose
arguments are tagged pairs, not JSON, is written so (tagged_grammar.py)."""

from __future__ import annotations

import json
import re

from llama_cpp.llama_grammar import json_schema_to_gbnf

from worker.engine.tagged_grammar import TAGGED, gbnf_literal, tagged_arguments

_RULE = re.compile(r"(?m)^([A-Za-z][A-Za-z0-9-]*)\s*::=")
_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z][A-Za-z0-9-]*|.', re.S)
"""A GBNF text in pieces: string literals, character classes, names, any other character."""


def _renamed(grammar: str, prefix: str) -> str:
    """`grammar` with every rule it defines renamed `prefix` + name, wherever it is named."""
    names = set(_RULE.findall(grammar))
    return "".join(prefix + piece if piece in names else piece
                   for piece in _TOKEN.findall(grammar))


def _root(block: str, separator: str) -> str:
    root = f"framed-block ::= {block}\nroot ::= framed-block"
    if separator:
        root += f" ({gbnf_literal(separator)} framed-block)*"
    return root


def framed_grammar(grammar: str, prefix: str, suffix: str, separator: str = "") -> str:
    """A schema's grammar whose value is written between `prefix` and `suffix` (repeated after
    `separator` when there is one): its `root` becomes `framed-value`."""
    body = re.sub(r"(?m)^root\s*::=", "framed-value ::=", grammar, count=1)
    block = " ".join(part for part in (gbnf_literal(prefix) if prefix else "", "framed-value",
                                       gbnf_literal(suffix) if suffix else "") if part)
    return f"{_root(block, separator)}\n{body}"


def framed_alternatives(schema: str, prefix: str, suffix: str, separator: str,
                        *named: str) -> str:
    """The grammar of `schema`'s `anyOf` alternatives, the i-th written after `prefix` and
    `named[i]`, each then closed by `suffix`."""
    alternatives = json.loads(schema).get("anyOf")
    if not isinstance(alternatives, list) or len(alternatives) != len(named):
        raise ValueError(f"a frame of {len(named)} functions needs an anyOf of as many schemas")
    rules, choices = [], []
    for i, (alternative, markers) in enumerate(zip(alternatives, named, strict=True)):
        if isinstance(alternative, dict) and TAGGED in alternative:  # tagged KEY/VALUE pairs
            rules.extend(tagged_arguments(alternative, f"f{i}-", _renamed))
        else:
            grammar = str(json_schema_to_gbnf(json.dumps(alternative, ensure_ascii=False)))
            rules.append(_renamed(grammar, f"f{i}-"))
        choices.append(" ".join(p for p in (gbnf_literal(markers) if markers else "",
                                            f"f{i}-root") if p))
    block = " ".join(part for part in (gbnf_literal(prefix) if prefix else "",
                                       f"({' | '.join(choices)})",
                                       gbnf_literal(suffix) if suffix else "") if part)
    return "\n".join((_root(block, separator), *rules))
