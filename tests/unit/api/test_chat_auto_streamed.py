"""Calls of templates the auto-parser reads (api/chat/autoparse/streamed.py) streamed as
llama-server streams them: for each call, a `tool_calls` delta with the index, id and name
first, then the arguments in pieces as they are written (not one piece at the end of the
call's block), the markers never in `content`; the deltas add up to the whole answer, and
/v1/messages' `input_json_delta` and /v1/responses' `function_call_arguments.delta` follow from
them. Before, each call came whole when its block closed."""

from __future__ import annotations

import json

import pytest

from api.chat.message import ChatDelta, ChatMessage
from api.chat.prepare import PreparedChat
from api.endpoints.anthropic.render import MessageStream
from api.endpoints.openai.render import Envelope, ResponseEvents
from tests.chat_cases import assemble
from tests.unit.api.test_anthropic_render import result
from tests.unit.api.test_chat_auto_format import CALL_ID_SOURCE, HY3, HY3_CALL, HY3_DAYS, _chat

SOLAR = "upstage-Solar-Open-100B"
SOLAR_CALL = ('<|tool_call:begin|>call00001<|tool_call:name|>get_weather<|tool_call:args|>'
              '{{"city": "{city}", "days": {days}}}<|tool_call:end|>')

CASES = {
    # tagged name, tagged arguments (a string value streams as it is written)
    "hy3": (HY3, None, "Let me check.<tool_calls:opensource>\n"
            + HY3_CALL.format(city="Paris, Île-de-France", more=HY3_DAYS)
            + HY3_CALL.format(city="Rome", more="") + "</tool_calls:opensource>",
            "Let me check."),
    "hy3-multiline": (HY3, None, "<tool_calls:opensource>\n"
                      + HY3_CALL.format(city="\nParis\nFrance\n", more="")
                      + "</tool_calls:opensource>", ""),
    # tagged name, JSON arguments, in a section
    "solar": (SOLAR, None, "Checking<|tool_calls|>" + SOLAR_CALL.format(city="Paris", days=3)
              + SOLAR_CALL.format(city="Rome", days=12) + "<|calls|>", "Checking"),
    # tagged name, the model's own call id, JSON arguments, to the end of the answer
    "call-id": ("", CALL_ID_SOURCE, 'Hi[FUNC_CALLS]get_weather[CALL_REF]abcXYZ[PARAMS]'
                '{"city": "Paris \\"centre\\"", "days": 14}'
                '[FUNC_CALLS]get_weather[CALL_REF]q9[PARAMS]{"city": "Rome"}', "Hi"),
}


def _stream(chat: PreparedChat, text: str) -> list[ChatDelta]:
    parser = chat.parser()
    deltas = [d for ch in text for d in parser.feed(ch)]
    return deltas + parser.flush()


def _no_ids(message: ChatMessage, keep: bool) -> list[tuple[str, str, str]]:
    return [(c.id if keep else "", c.name, c.arguments) for c in message.tool_calls]


@pytest.mark.parametrize("case", CASES)
def test_each_call_streams_its_arguments_in_pieces(case: str) -> None:
    name, source, text, content = CASES[case]
    chat = _chat(name, parallel=True, source=source)
    deltas = _stream(chat, text)
    whole, streamed = chat.parse(text), assemble(deltas)
    ids = case == "call-id"
    assert _no_ids(streamed, ids) == _no_ids(whole, ids)
    assert streamed.content == whole.content == content
    assert len(whole.tool_calls) == (1 if case == "hy3-multiline" else 2)
    for index, call in enumerate(whole.tool_calls):
        head, *pieces = [tc for d in deltas for tc in d.tool_calls if tc.index == index]
        assert (head.name, head.arguments) == ("get_weather", "")
        assert head.id and (head.id == call.id or not ids)
        assert all(p.name is None and p.id is None for p in pieces)
        assert len(pieces) > 2, pieces  # before: one piece, the whole arguments at the end
        assert "".join(p.arguments for p in pieces) == call.arguments
    at = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert all(not d.tool_calls for d in deltas[:at]) and \
        all(not d.content for d in deltas[at:])  # no marker, nor a piece of one, in content
    second = [i for i, d in enumerate(deltas) for tc in d.tool_calls if tc.index == 1]
    first = [i for i, d in enumerate(deltas) for tc in d.tool_calls if tc.index == 0]
    assert not second or max(first) < min(second)  # the first call ends before the second


def test_a_string_value_streams_as_written_less_its_markup() -> None:
    """Hy3's `<arg_key>K</arg_key>\\n<arg_value>\\nVALUE</arg_value>`: the newline opening the
    value is markup (as the whole answer reads it), the value's text streams as it is written,
    its closing tag half written is held back."""
    chat = _chat(HY3, parallel=True)
    text = "<tool_calls:opensource>\n" + HY3_CALL.format(city="\nParis\nFrance\n", more="")
    parser = chat.parser()
    sent = ""
    for ch in text[:text.index("</arg_value")] + "</arg_val":
        sent += "".join(tc.arguments for d in parser.feed(ch) for tc in d.tool_calls)
    assert sent == '{"city":"Paris\\nFrance\\n'
    assert chat.parse(text + "</tool_calls:opensource>").tool_calls[0].arguments == \
        '{"city":"Paris\\nFrance\\n"}'


def test_the_wires_follow_the_pieces() -> None:
    """/v1/messages' tool_use block gets the pieces as `input_json_delta`s, /v1/responses'
    function_call item as `function_call_arguments.delta`s, each adding up to the arguments."""
    name, source, text, _ = CASES["solar"]
    chat = _chat(name, parallel=True, source=source)
    deltas = _stream(chat, text)
    message = assemble(deltas)
    anthropic = MessageStream("msg_1", "m")
    events = anthropic.start(None)
    for delta in deltas:
        events += anthropic.feed([delta])
    events += anthropic.finish(result("eos"), message)
    starts = [d["index"] for n, d in events if n == "content_block_start"
              and d["content_block"]["type"] == "tool_use"]
    json_deltas = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"
                   and d["index"] == starts[0] and d["delta"]["type"] == "input_json_delta"]
    assert len(json_deltas) > 2
    assert json.loads("".join(json_deltas)) == json.loads(message.tool_calls[0].arguments)
    responses = ResponseEvents(Envelope("resp_1", "m", 1))
    out = responses.start()
    for delta in deltas:
        out += responses.delta(delta)
    out += responses.finish(message, [result("eos")])
    item = "fc_" + message.tool_calls[0].id
    pieces = [d["delta"] for n, d in out if n == "response.function_call_arguments.delta"
              and d["item_id"] == item]
    assert len(pieces) > 2 and "".join(pieces) == message.tool_calls[0].arguments
    done = [d["item"] for n, d in out if n == "response.output_item.done"
            and d["item"]["type"] == "function_call"]
    assert [d["arguments"] for d in done] == [c.arguments for c in message.tool_calls]


@pytest.mark.parametrize(("case", "cut_at", "kept"), [
    ("solar", '"days"', ['{"city":"Paris"']),  # a section with an end marker
    ("call-id", '"centre', ['{"city":"Paris \\"']),  # calls running to the end of the answer
    ("hy3", "days</arg_key", ['{"city":"Paris, Île-de-France"']),
    ("solar", "Rome", ['{"city":"Paris","days":3}', '{"city":"R']),  # in the second call
    ("call-id", '"Rome', ['{"city":"Paris \\"centre\\"","days":14}', '{"city":"']),
    ("hy3", "Rome", ['{"city":"Paris, Île-de-France","days":3}', '{"city":"R']),
])
def test_a_call_cut_short_keeps_what_was_streamed(case: str, cut_at: str,
                                                  kept: list[str]) -> None:
    """`max_tokens` ends the answer inside a call: the calls before it are kept whole, it with
    its arguments as far as they are certain (unclosed, as llama.cpp keeps a call cut short),
    streamed and whole alike."""
    name, source, text, content = CASES[case]
    chat = _chat(name, parallel=True, source=source)
    cut = text[:text.index(cut_at) + 1]
    whole, streamed = chat.parse(cut), assemble(_stream(chat, cut))
    for message in (whole, streamed):
        assert [(c.name, c.arguments) for c in message.tool_calls] == \
            [("get_weather", arguments) for arguments in kept]
        assert message.content == content


@pytest.mark.parametrize("case", ["hy3", "solar", "call-id"])
def test_parallel_tool_calls_off_keeps_the_first_call(case: str) -> None:
    """Two calls in an answer under `parallel_tool_calls: false`: the first is kept, streamed
    and whole alike (llama-server answers 500 "The model produced output that does not match
    the expected peg-native format" under Solar Open's template, its parser reading one call;
    docs/endpoints.md)."""
    name, source, text, content = CASES[case]
    chat = _chat(name, parallel=False, source=source)
    whole, streamed = chat.parse(text), assemble(_stream(chat, text))
    for message in (whole, streamed):
        assert [c.name for c in message.tool_calls] == ["get_weather"]
        assert message.content == content
    assert streamed.tool_calls[0].arguments == whole.tool_calls[0].arguments
    assert json.loads(whole.tool_calls[0].arguments)["city"] != "Rome"
