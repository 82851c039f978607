"""A forced call's arguments as tagged pairs (Hy3's `<arg_key>K</arg_key>\\n<arg_value>V
</arg_value>\\n`): llama.cpp's grammar for them (`build_tool_parser_tag_tagged`) written in
GBNF that llama.cpp accepts: a string value is any text without the value's closing marker
(the marker's automaton complemented, as `gbnf_excluding_grammar`), another value the JSON its
schema allows; required pairs in order, optional ones after, in any order."""

from __future__ import annotations

import json
import re

import llama_cpp as lc
import pytest

from scheduler.contract.jobs import CompletionJob
from worker.engine.requests import grammar_of
from worker.engine.tagged_grammar import TAGGED, excluding, may_be_string

_ALTERNATIVE = re.compile(r"\[(\^?)((?:\\.|[^\]\\])*)\] (\S+)")


def _unescape(chars: str) -> set[str]:
    return set(re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(
        m.group(1), m.group(1)), chars))


def _matches(rules: list[str], start: str, text: str) -> bool:
    """Whether `text` matches `start` in the automaton `excluding` writes: each rule is the
    empty alternative, then `[chars] next-state` alternatives (the last one negated)."""
    table = {}
    for rule in rules:
        name, rhs = rule.split(" ::= ")
        assert rhs.startswith("|")  # every state accepts
        table[name] = [(neg == "^", _unescape(chars), nxt)
                       for neg, chars, nxt in _ALTERNATIVE.findall(rhs)]
    states = {start}
    for c in text:
        states = {nxt for s in states for neg, chars, nxt in table[s] if (c in chars) != neg}
        if not states:
            return False
    return True


@pytest.mark.parametrize("marker", ["</arg_value:opensource>\n", "aab", "abab]^-\\"])
def test_a_string_value_is_any_text_without_the_closing_marker(marker: str) -> None:
    rules = excluding("v", marker)
    for text in ("", "Paris, FR", "a < b </arg_value", marker[:-1], marker[1:],
                 "x" + marker[:-1] + marker[:-1], "aaba", "abab]^-"):
        assert _matches(rules, "v", text) == (marker not in text), (marker, text)
    for text in (marker, "Rome" + marker, "a" + marker + "b", marker[:1] + marker):
        assert not _matches(rules, "v", text), (marker, text)
    grammar = "root ::= v\n" + "\n".join(rules)
    assert lc.llama_grammar.LlamaGrammar.from_string(grammar, verbose=False) is not None


MARKERS = ["<arg_key:opensource>", "</arg_key:opensource>\n<arg_value:opensource>",
           "</arg_value:opensource>\n"]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "units": {"enum": ["c", "f"]}, "hourly": {"type": "boolean"}},
    "required": ["city", "days"], TAGGED: MARKERS}


def test_a_job_forcing_tagged_arguments_gets_their_grammar() -> None:
    """The frame's alternatives marked TAGGED: the required pairs in the schema's order, the
    optional ones in any order after them; string values (an enum of strings too) up to the
    closing marker, the others as their JSON schema allows; a grammar llama.cpp parses."""
    empty = {"type": "object", "properties": {}, TAGGED: MARKERS}
    job = CompletionJob(model="m", prompt="p", json_schema=json.dumps({"anyOf": [WEATHER, empty]}),
                        json_schema_frame=["<tool_calls:opensource>\n<tool_call:opensource>",
                                           "</tool_call:opensource>\n</tool_calls:opensource>",
                                           "", "get_weather<tool_sep:opensource>",
                                           "empty_args<tool_sep:opensource>"])
    grammar = grammar_of(job, defaults=None)  # type: ignore[arg-type]
    assert grammar is not None
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["f0-root"] == "f0-space f0-arg0 f0-space f0-arg1 " \
        "(f0-space (f0-arg2 | f0-arg3))* f0-space"
    assert rules["f0-space"] == '| " " | "\\n"{1,2} [ \\t]{0,20}'
    assert rules["f0-arg0"] == ('"<arg_key:opensource>city</arg_key:opensource>\\n'
                                '<arg_value:opensource>" f0-until "</arg_value:opensource>\\n"')
    assert rules["f0-arg1"].endswith('f0-a1-root "</arg_value:opensource>\\n"')
    assert "f0-until" in rules["f0-arg2"] and "f0-a3-root" in rules["f0-arg3"]
    assert rules["f0-a3-root"].startswith('("true" | "false")')
    assert rules["f1-root"].split() == ["f1-space", "f1-space"]
    assert "f1-until" not in rules  # no string to write
    assert lc.llama_grammar.LlamaGrammar.from_string(grammar, verbose=False) is not None


@pytest.mark.parametrize(("schema", "string"), [
    ({"type": "string"}, True), ({"type": ["integer", "string"]}, True),
    ({"enum": [1, "a"]}, True), ({"const": "x"}, True), ({"anyOf": [{"type": "string"}]}, True),
    ({"type": "integer"}, False), ({"enum": [1, 2]}, False), ({"type": "object"}, False)])
def test_which_values_are_written_as_text(schema: dict[str, object], string: bool) -> None:
    assert may_be_string(schema) is string
