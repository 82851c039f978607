"""Blocks of several calls stream each call as llama-server does: its id and name, then its
arguments in pieces as they are written, the calls one after the other, the deltas adding up
to the whole answer — the families llama.cpp reads with its auto-parser whose calls are
listed in one block (api/chat/listed_calls.py: Nemotron-Nano-v2 and Apriel's JSON lists,
Apertus's `{"NAME": {…}}` items, MiniMax-M2's invokes), where each call came whole when its
block closed, and Kimi-K2's sections, DeepSeek V3.2's DSML blocks, Command-R7B's action lists
a `<tool_call>` of several XML functions and LFM2's pythonic lists (api/chat/streamed_calls.py),
where only the first call streamed so (LFM2's not even its arguments)."""

from __future__ import annotations

import json

import pytest

from api.chat.message import ChatDelta
from tests.unit.api.test_chat_agent_formats import assemble, prepared

CASES = {
    "nemotron": ("NVIDIA-Nemotron-Nano-v2.jinja",  # its prompt opens a thinking block
                 'Paris it is.</think>\n<TOOLCALL>[{"name": "get_weather", "arguments": '
                 '{"location": "Paris, FR", '
                 '"days": 3}}, {"name": "special_function", "arguments": {"arg1": 12}}]'
                 "</TOOLCALL>"),
    "apriel": ("unsloth-Apriel-1.5.jinja",
               '<tool_calls>[{"name": "get_weather", "arguments": {"location": "Paris, FR", '
               '"days": 3}}, {"name": "special_function", "arguments": {"arg1": 12}}]'
               "</tool_calls>"),
    "apertus": ("Apertus-8B-Instruct.jinja",
                '<|tools_prefix|>[{"get_weather": {"location": "Paris, FR", "days": 3}}, '
                '{"special_function": {"arg1": 12}}]<|tools_suffix|>'),
    "minimax-m2": ("MiniMax-M2.jinja",
                   'Paris it is.</think>\n<minimax:tool_call>\n<invoke name="get_weather">\n'
                   '<parameter name="location">Paris, FR</parameter>\n'
                   '<parameter name="days">3</parameter>\n</invoke>\n'
                   '<invoke name="special_function">\n<parameter name="arg1">12</parameter>\n'
                   "</invoke>\n</minimax:tool_call>"),
    "kimi-k2": ("Kimi-K2-Instruct.jinja",
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"location": "Paris, FR", "days": 3}'
                "<|tool_call_end|><|tool_call_begin|>functions.special_function:1"
                '<|tool_call_argument_begin|>{"arg1": 12}<|tool_call_end|>'
                "<|tool_calls_section_end|>"),
    "dsml": ("deepseek-ai-DeepSeek-V3.2.jinja",
             '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
             '<｜DSML｜parameter name="location" string="true">Paris, FR</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n<｜DSML｜invoke name="special_function">\n'
             '<｜DSML｜parameter name="arg1" string="false">12</｜DSML｜parameter>\n'
             "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
    "command-r7b": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
                    "<|START_THINKING|>ok<|END_THINKING|><|START_ACTION|>[\n"
                    '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
                    '{"location": "Paris, FR", "days": 3}},\n'
                    '    {"tool_call_id": "1", "tool_name": "special_function", '
                    '"parameters": {"arg1": 12}}\n]<|END_ACTION|>'),
    "xml-functions": ("Qwen-Qwen2.5-7B-Instruct.jinja",
                      "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, FR\n"
                      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                      "<function=special_function>\n<parameter=arg1>\n12\n</parameter>\n"
                      "</function>\n</tool_call>"),
    "lfm2": ("LFM2-8B-A1B.jinja",
             '<|tool_call_start|>[get_weather(location="Paris, FR", days=3), '
             "special_function(arg1=12)]<|tool_call_end|>"),
    "lfm2-single-quoted": ("LFM2.5-Instruct.jinja",
                           "<|tool_call_start|>[get_weather(location='Paris, FR',days=3),"
                           "special_function(arg1=12)]<|tool_call_end|>"),
}


def _stream(case: str, text: str, parallel: bool = True) -> tuple[list[ChatDelta], object]:
    chat = prepared(CASES[case][0], parallel_tool_calls=parallel)
    parser = chat.parser()
    deltas = [d for ch in text for d in parser.feed(ch)]
    return deltas + parser.flush(), chat.parse(text)


@pytest.mark.parametrize("case", CASES)
def test_each_call_streams_its_arguments_in_pieces(case: str) -> None:
    deltas, whole = _stream(case, CASES[case][1])
    streamed = assemble(deltas)
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == \
        [(c.name, c.arguments) for c in whole.tool_calls] == [  # type: ignore[attr-defined]
            ("get_weather", '{"location":"Paris, FR","days":3}'),
            ("special_function", '{"arg1":12}')]
    assert streamed.content == ""
    last = -1
    for index in (0, 1):
        at = [i for i, d in enumerate(deltas) for tc in d.tool_calls if tc.index == index]
        head, *pieces = [tc for d in deltas for tc in d.tool_calls if tc.index == index]
        assert head.id and head.name and head.arguments == ""
        assert len(pieces) > 1 and all(p.name is None for p in pieces), pieces
        assert min(at) > last  # each call ends before the next begins
        last = max(at)


@pytest.mark.parametrize("case", CASES)
def test_a_call_cut_short_keeps_what_was_streamed(case: str) -> None:
    """The answer ends inside the second call: the first is kept whole, the second once named
    with its arguments as far as they are certain, streamed and whole alike."""
    text = CASES[case][1]
    cut = text[:text.index("12") + 1]
    deltas, whole = _stream(case, cut)
    calls = [(c.name, c.arguments) for c in assemble(deltas).tool_calls]
    assert calls == [(c.name, c.arguments) for c in whole.tool_calls]  # type: ignore[attr-defined]
    assert calls[0] == ("get_weather", '{"location":"Paris, FR","days":3}')
    assert [name for name, _ in calls] == ["get_weather", "special_function"]


@pytest.mark.parametrize("case", CASES)
def test_parallel_tool_calls_off_streams_the_first_call_only(case: str) -> None:
    deltas, whole = _stream(case, CASES[case][1], parallel=False)
    assert {tc.index for d in deltas for tc in d.tool_calls} == {0}
    assert [c.name for c in assemble(deltas).tool_calls] == \
        [c.name for c in whole.tool_calls] == ["get_weather"]  # type: ignore[attr-defined]


def test_lfm2_values_of_every_kind_stream_as_the_whole_answer_reads_them() -> None:
    """Escapes, quotes of either kind, containers, Python and JSON literals, a dotted name:
    each call's pieces add up to the whole answer's arguments, string values arriving as they
    are written."""
    text = ("<|tool_call_start|>[write_file(path='it\\'s \"here\".txt', content=\"a\\nb\\\\c é\", "
            "overwrite=True), special_function_with_opt(arg1=-4, arg2={'k': [1, None, false]}),"
            " tools.empty_args()]<|tool_call_end|>")
    chat = prepared("LFM2-8B-A1B.jinja")
    parser = chat.parser()
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.flush()
    whole = chat.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("write_file", {"path": "it's \"here\".txt", "content": "a\nb\\c é", "overwrite": True}),
        ("special_function_with_opt", {"arg1": -4, "arg2": {"k": [1, None, False]}}),
        ("tools.empty_args", {})]
    streamed = assemble(deltas)
    assert [(c.name, c.arguments) for c in streamed.tool_calls] == \
        [(c.name, c.arguments) for c in whole.tool_calls]
    content = [tc.arguments for d in deltas for tc in d.tool_calls if tc.index == 0]
    assert sum('"content":"a' in piece or piece == "\\n" or piece == "b" for piece in content) \
        >= 2, content  # the string value in pieces, as written


LFM2_TEXT = CASES["lfm2"][1]


@pytest.mark.parametrize(("cut", "second"), [
    ("get_weather(location=", None), ('get_weather(location="Pa', None),
    ("days=", None), ("days=3", None), ("arg1=", '{"arg1":'), ("arg1=1", '{"arg1":1'),
    ("arg1=12)", '{"arg1":12}')])
def test_lfm2_cut_short_keeps_what_llama_cpp_keeps(cut: str, second: str | None) -> None:
    """The answer ends inside LFM2's list: each call as llama.cpp's parse of that text keeps it
    (the vendored parser's answers, bench/chat_oracle): a key once its `=` is written, a string
    and an integer as far as written, streamed and whole alike."""
    first = {"get_weather(location=": '{"location":', 'get_weather(location="Pa':
             '{"location":"Pa', "days=": '{"location":"Paris, FR","days":',
             "days=3": '{"location":"Paris, FR","days":3'}.get(
        cut, '{"location":"Paris, FR","days":3}')
    text = LFM2_TEXT[:LFM2_TEXT.index(cut) + len(cut)]
    deltas, whole = _stream("lfm2", text)
    expected = [("get_weather", first)] + ([("special_function", second)] if second else [])
    assert [(c.name, c.arguments) for c in whole.tool_calls] == expected  # type: ignore[attr-defined]
    assert [(c.name, c.arguments) for c in assemble(deltas).tool_calls] == expected
