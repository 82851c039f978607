"""A forced tool call's grammar in the template's own markers (`json_schema_frame`): the
schema's grammar framed by literal markers, repeated after a separator for parallel calls, and
the result a grammar llama.cpp accepts; with several functions named in the markers, one
alternative per function, each in its own markers before its own schema."""

from __future__ import annotations

import json

import llama_cpp as lc
import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob
from worker.engine.framed_grammar import framed_alternatives
from worker.engine.requests import framed_grammar, grammar_of


def test_the_frame_wraps_the_schemas_root_and_repeats_after_the_separator() -> None:
    inner = str(json_schema_to_gbnf('{"type": "object", "properties": {"a": {"type": "integer"}}}'))
    grammar = framed_grammar(inner, "<tool_call>\n", '\n</tool_call> "q"\\', "\n")
    lines = grammar.splitlines()
    assert lines[0] == ('framed-block ::= "<tool_call>\\n" framed-value '
                        '"\\n</tool_call> \\"q\\"\\\\"')
    assert lines[1] == 'root ::= framed-block ("\\n" framed-block)*'
    assert sum(line.startswith("root ::=") for line in lines) == 1
    assert any(line.startswith("framed-value ::=") for line in lines)
    parsed = lc.llama_grammar.LlamaGrammar.from_string(grammar, verbose=False)
    assert parsed is not None


def test_a_job_with_a_frame_gets_the_framed_grammar() -> None:
    job = CompletionJob(model="m", prompt="p", json_schema='{"type": "integer"}',
                        json_schema_frame=["[TOOL_CALLS]", "", ""])
    grammar = grammar_of(job, defaults=None)  # type: ignore[arg-type]
    assert grammar is not None
    assert grammar.startswith('framed-block ::= "[TOOL_CALLS]" framed-value')
    assert "(" not in grammar.splitlines()[1]  # no separator: one block


CITY = {"type": "object", "properties": {"city": {"enum": ["space", "root"]}},
        "required": ["city"]}
DAYS = {"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"]}
SOLAR = ["<|tool_calls|><|tool_call:begin|>call00001<|tool_call:name|>",
         "<|tool_call:end|><|calls|>", ""]


def test_each_function_is_an_alternative_in_its_own_markers() -> None:
    """Solar Open's markers, two functions (the same schema twice, then another): the block
    is the common markers, then one function's name and markers before that function's own
    schema, then the closing markers; each schema's rules renamed apart, its literals (an enum
    value spelling a rule's name) kept."""
    schema = json.dumps({"anyOf": [CITY, CITY, DAYS]})
    grammar = framed_alternatives(schema, *SOLAR, "a<|tool_call:args|>", "b<|tool_call:args|>",
                                  "c<|tool_call:args|>")
    lines = grammar.splitlines()
    assert lines[0] == ('framed-block ::= "<|tool_calls|><|tool_call:begin|>call00001'
                        '<|tool_call:name|>" ("a<|tool_call:args|>" f0-root | '
                        '"b<|tool_call:args|>" f1-root | "c<|tool_call:args|>" f2-root) '
                        '"<|tool_call:end|><|calls|>"')
    assert lines[1] == "root ::= framed-block"
    assert 'f1-city ::= "\\"space\\"" | "\\"root\\""' in lines
    assert any(line.startswith("f2-root ::=") and "f2-days-kv" in line for line in lines)
    defined = [line.split(" ::=")[0] for line in lines]
    assert len(defined) == len(set(defined))
    assert lc.llama_grammar.LlamaGrammar.from_string(grammar, verbose=False) is not None


def test_a_job_framing_several_functions_gets_their_alternatives() -> None:
    job = CompletionJob(model="m", prompt="p", json_schema=json.dumps({"anyOf": [CITY, DAYS]}),
                        json_schema_frame=[*SOLAR, "a<|tool_call:args|>", "b<|tool_call:args|>"])
    grammar = grammar_of(job, defaults=None)  # type: ignore[arg-type]
    assert grammar is not None and '("a<|tool_call:args|>" f0-root | ' in grammar
    job.json_schema_frame = [*SOLAR, "a<|tool_call:args|>"]  # one name for two schemas
    with pytest.raises(InvalidRequest, match="Failed to convert the JSON schema"):
        grammar_of(job, defaults=None)  # type: ignore[arg-type]
