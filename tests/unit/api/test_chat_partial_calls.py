"""A JSON tool call streamed while it is written (api/chat/partial_calls.py): what is sent of
its arguments at any point is a prefix of the arguments the whole call gives, the name is sent
only once complete, and a `<tool_call>` block's call reaches the client in pieces."""

from __future__ import annotations

import json

import pytest

from api.chat.parsing import ChatOutputParser
from api.chat.partial_calls import close_partial_json, partial_call
from api.chat.tool_formats import dump_arguments
from tests.chat_cases import ported, prepare

CALLS = [
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    '{"name": "write_file", "arguments": {"path": "a\\"b\\\\c\\u00e9\\n", "lines": [1, 2.5, -3e2],'
    ' "opts": {"overwrite": true, "mode": null, "tags": []}}}',
    '{"arguments": {"x": 1}, "name": "late_name"}',
    '{"name": "empty", "arguments": {}}',
    '{ "name" : "spaced" ,\n "arguments" : { "a" : [ { "b" : "c" } ] } }',
]


@pytest.mark.parametrize("text", CALLS)
def test_what_is_certain_is_always_a_prefix_of_the_whole(text: str) -> None:
    whole = json.loads(text)
    final = dump_arguments(whole["arguments"])
    sent = ""
    for end in range(1, len(text) + 1):
        closed = close_partial_json(text[:end])
        assert closed is not None
        json.loads(closed[0])  # always valid JSON once closed
        partial = partial_call(text[:end])
        if partial is None:
            continue
        name, certain, guess = partial
        assert name == whole["name"]
        assert final.startswith(certain) and certain.startswith(sent)
        assert guess.startswith(certain)
        sent = certain
    assert sent == final


def test_not_an_object_is_no_partial_call() -> None:
    assert close_partial_json("[1, 2") is None
    assert partial_call('{"name": "f') is None  # the name may still grow
    assert partial_call('{"name": "f"') == ("f", "", "{}")  # named: a call, as llama.cpp has it
    assert partial_call('{"name": "f", "arguments": "x"}') is None


def test_a_tool_call_block_streams_its_arguments_in_pieces() -> None:
    text = ('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"days": 3}}\n</tool_call>')
    parser = ChatOutputParser(reasoning_format="none", tools=True)
    pieces: list[tuple[int, str | None, str | None, str]] = []
    for ch in text:
        for delta in parser.feed(ch):
            pieces += [(tc.index, tc.id, tc.name, tc.arguments) for tc in delta.tool_calls]
    for delta in parser.flush():
        pieces += [(tc.index, tc.id, tc.name, tc.arguments) for tc in delta.tool_calls]
    (head, *rest) = pieces
    assert head[1] and head[2] == "get_weather" and head[3] == ""
    assert len(rest) > 5 and all(p[1] is None and p[2] is None for p in rest)
    assert "".join(p[3] for p in rest) == '{"city":"Paris","days":3}'
    # the name is sent before the arguments' end is written
    message = parser.finish()
    assert message.content == "Sure." and message.tool_calls[0].id == head[1]


def test_a_qwen3_coder_call_streams_its_string_parameter_as_written() -> None:
    case = {"template": "Qwen3-Coder.jinja", "input": "", "params": {"tools": ["edit"]},
            "expect": {}}
    assert "edit" in ported()["tools"]
    chat = prepare(case)
    text = ("<tool_call>\n<function=edit>\n<parameter=filename>\nfoo.c\n</parameter>\n"
            "<parameter=newString>\n#include <x>\nint main;\n\n</parameter>\n</function>\n"
            "</tool_call>")
    parser = chat.parser()
    pieces: list[str] = []
    for ch in text:
        for delta in parser.feed(ch):
            pieces += [tc.arguments for tc in delta.tool_calls if tc.arguments]
    for delta in parser.flush():
        pieces += [tc.arguments for tc in delta.tool_calls if tc.arguments]
    final = '{"filename":"foo.c","newString":"#include <x>\\nint main;\\n"}'
    assert "".join(pieces) == final
    assert len(pieces) > 10  # the string parameter's text arrives as it is written
    assert parser.finish().tool_calls[0].arguments == final
