"""A forced tool call's grammar in the template's own markers (`json_schema_frame`): the
schema's grammar framed by literal markers, repeated after a separator for parallel calls, and
the result a grammar llama.cpp accepts."""

from __future__ import annotations

import llama_cpp as lc
from llama_cpp.llama_grammar import json_schema_to_gbnf

from scheduler.contract.jobs import CompletionJob
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
