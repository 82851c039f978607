"""Blocks of several calls stream each call as llama-server does: its id and name, then its
arguments in pieces as they are written, the calls one after the other, the deltas adding up
to the whole answer — the families llama.cpp reads with its auto-parser whose calls are
listed in one block (api/chat/listed_calls.py: Nemotron-Nano-v2 and Apriel's JSON lists,
Apertus's `{"NAME": {…}}` items, MiniMax-M2's invokes), where each call came whole when its
block closed, and Kimi-K2's sections, DeepSeek V3.2's DSML blocks, Command-R7B's action lists
and a `<tool_call>` of several XML functions (api/chat/streamed_calls.py), where only the
first call streamed so."""

from __future__ import annotations

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
