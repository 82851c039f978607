"""ChatOutputParser on recorded-style model outputs: reasoning, tool-call formats, streaming."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from api.chat.message import ChatDelta, ChatMessage
from api.chat.parsing import ChatOutputParser
from api.chat.reasoning_tags import check_reasoning_format, prompt_opens_thinking, reasoning_tags
from api.chat.request_tools import validate_tools
from api.chat.tool_formats import JsonScanner, random_string
from api.chat.tool_grammar import tool_call_grammar
from scheduler.contract.errors import InvalidRequest

WEATHER = '{"location": "Paris, France", "unit": "celsius"}'


def parse(text: str, **kwargs) -> ChatMessage:
    kwargs.setdefault("reasoning_format", "auto")
    kwargs.setdefault("tools", True)
    parser = ChatOutputParser(**kwargs)
    parser.feed(text)
    return parser.finish()


def _arguments(text: str) -> Any:
    """A call's arguments as a JSON value; those of a call cut short stay text (unclosed JSON,
    as llama-server gives them)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def calls(message: ChatMessage) -> list[tuple[str, Any]]:
    return [(call.name, _arguments(call.arguments)) for call in message.tool_calls]


def assemble(deltas: list[ChatDelta]) -> ChatMessage:
    """What an OpenAI client builds from the stream's deltas."""
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning_content for d in deltas)
    built: dict[int, list[str]] = {}
    for delta in deltas:
        for tc in delta.tool_calls:
            if tc.id is not None:
                assert tc.index not in built and tc.name and tc.arguments == ""
                built[tc.index] = [tc.id, tc.name, ""]
            else:
                assert tc.name is None
                built[tc.index][2] += tc.arguments
    assert sorted(built) == list(range(len(built)))
    from api.chat.message import ToolCall

    return ChatMessage(
        content=content,
        reasoning_content=reasoning or None,
        tool_calls=[ToolCall(*built[i]) for i in sorted(built)],
    )


def stream(text: str, sizes: list[int] | None, **kwargs) -> tuple[list[ChatDelta], ChatMessage]:
    kwargs.setdefault("reasoning_format", "auto")
    kwargs.setdefault("tools", True)
    parser = ChatOutputParser(**kwargs)
    deltas: list[ChatDelta] = []
    pos = 0
    for size in sizes or [len(text)]:
        deltas += parser.feed(text[pos : pos + size])
        pos += size
    assert pos >= len(text)
    deltas += parser.flush()
    return deltas, parser.finish()


def chunkings(text: str) -> list[list[int]]:
    out = [[1] * len(text), [len(text)]]
    for seed in range(6):
        rng = random.Random(seed)
        sizes, total = [], 0
        while total < len(text):
            sizes.append(rng.randint(1, 9))
            total += sizes[-1]
        out.append(sizes)
    return out


# recorded-style outputs: (text, parser kwargs, expected content, reasoning, calls)
DEEPSEEK_R1 = (
    "Okay, the user is asking what 17 times 23 is. Let me compute: 17*20 = 340, 17*3 = 51, "
    "so 340 + 51 = 391.\n</think>\n\n17 × 23 = **391**."
)
QWEN3_THINK_CALL = (
    "<think>\nThe user wants the weather in Paris. I have a get_weather tool, so I should call "
    "it with location Paris, France.\n</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": ' + WEATHER + "}\n</tool_call>"
)
QWEN_PARALLEL = (
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"location": "Paris, France"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n'
    "</tool_call>"
)
HERMES_WITH_TEXT = (
    "I'll look up Tesla's fundamentals for you.\n\n<tool_call>\n"
    '{"arguments": {"symbol": "TSLA"}, "name": "get_stock_fundamentals"}\n</tool_call>\n'
)
QWEN3_CODER = (
    "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.py\n</parameter>\n"
    '<parameter=content>\nprint("hello")\n</parameter>\n<parameter=overwrite>\ntrue\n'
    "</parameter>\n</function>\n</tool_call>"
)
LLAMA31_JSON = (
    '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", '
    '"unit": "Fahrenheit"}}'
)
LLAMA32_TWO = (
    '{"type": "function", "name": "get_weather", "parameters": {"location": "Paris"}}; '
    '{"type": "function", "name": "get_time", "parameters": {"timezone": "CET"}}'
)
LLAMA31_BUILTIN = '<|python_tag|>brave_search.call(query="current weather in Menlo Park, CA")'
LLAMA31_CODE = "<|python_tag|>import math\nprint(math.sqrt(2))"
LLAMA31_FUNCTION_TAG = '<function=get_weather>{"location": "Paris"}</function>'
MISTRAL_NEMO = (
    '[TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
    '"format": "celsius"}, "id": "a1b2C3d4E"}, {"name": "get_time", "arguments": "{}", '
    '"id": "Zz9Yy8Xx7"}]'
)
MISTRAL_SMALL = (
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]abc123xyz'
    '[ARGS]{"timezone": "Europe/Paris"}'
)
GENERIC_ONE = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
GENERIC_MANY = (
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}, '
    '{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "call_2"}]}'
)
DEEPSEEK_CALL = (
    "<think>\nNeed weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
    '<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜>"
)
DEEPSEEK_V31_CALL = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)

P = pytest.param
LEGACY = {"reasoning_format": "deepseek-legacy"}
R1_THOUGHT = (
    "Okay, the user is asking what 17 times 23 is. Let me compute: 17*20 = 340, 17*3 = 51, "
    "so 340 + 51 = 391."
)
QWEN3_THOUGHT = (
    "The user wants the weather in Paris. I have a get_weather tool, so I should call it with "
    "location Paris, France."
)
BROKEN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call> sorry'
TRUNCATED = 'Checking.<tool_call>\n{"name": "get_weather", "argu'
TRUNCATED_JSON = '{"name": "get_weather", "arguments": {"city": "Par'
PROSE = "Use the <tool> element, or [TOOLS] or {braces}."
PARIS_AND_TIME = [
    ("get_weather", {"location": "Paris, France"}),
    ("get_time", {"timezone": "Europe/Paris"}),
]
CODER_ARGS = {"path": "src/main.py", "content": 'print("hello")', "overwrite": True}
NEMO_CALLS = [
    ("get_current_weather", {"location": "Paris, France", "format": "celsius"}),
    ("get_time", {}),
]

# (output, parser kwargs, content, reasoning_content, calls)
# fmt: off
CASES = [
    P(DEEPSEEK_R1, {"thinking_forced_open": True}, "17 × 23 = **391**.", R1_THOUGHT, [],
        id="deepseek-r1-forced-open"),
    P("<think>\nHmm, a greeting.\n</think>\n\nHello! How can I help?", {}, "Hello! How can I help?",
        "Hmm, a greeting.", [], id="think-block"),
    P(QWEN3_THINK_CALL, {}, "", QWEN3_THOUGHT, [("get_weather", json.loads(WEATHER))],
        id="qwen3-think-then-call"),
    P(QWEN_PARALLEL, {}, "", None, PARIS_AND_TIME, id="qwen-two-parallel-calls"),
    P(HERMES_WITH_TEXT, {}, "I'll look up Tesla's fundamentals for you.", None,
        [("get_stock_fundamentals", {"symbol": "TSLA"})], id="hermes-text-then-call"),
    P(QWEN3_CODER, {}, "", None, [("write_file", CODER_ARGS)], id="qwen3-coder-xml"),
    P(LLAMA31_JSON, {}, "", None,
        [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})],
        id="llama31-json"),
    P(LLAMA32_TWO, {}, "", None,
        [("get_weather", {"location": "Paris"}), ("get_time", {"timezone": "CET"})],
        id="llama32-two-json-calls"),
    P(LLAMA31_BUILTIN, {}, "", None,
        [("brave_search", {"query": "current weather in Menlo Park, CA"})], id="llama31-builtin"),
    P(LLAMA31_CODE, {}, "", None, [("python", {"code": "import math\nprint(math.sqrt(2))"})],
        id="llama31-code-interpreter"),
    P(LLAMA31_FUNCTION_TAG, {}, "", None, [("get_weather", {"location": "Paris"})],
        id="llama31-function-tag"),
    P(MISTRAL_NEMO, {}, "", None, NEMO_CALLS, id="mistral-nemo"),
    P(MISTRAL_SMALL, {}, "", None,
        [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})],
        id="mistral-small-args"),
    P(GENERIC_ONE, {}, "", None, [("get_weather", {"city": "Paris"})], id="generic-one"),
    P(GENERIC_MANY, {}, "", None,
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})], id="generic-many"),
    P('{"response": "It is sunny in Paris."}', {}, "It is sunny in Paris.", None, [],
        id="generic-response"),
    P(DEEPSEEK_CALL, {}, "", "Need weather.", [("get_weather", {"city": "Paris"})],
        id="deepseek-r1-call"),
    P(DEEPSEEK_V31_CALL, {}, "", None, [("get_weather", {"city": "Oslo"})], id="deepseek-v31-call"),
    P("  The answer is 4.\n\n", {}, "  The answer is 4.\n\n", None, [], id="plain-text-exact"),
    P('{"answer": 42, "unit": null}', {}, '{"answer": 42, "unit": null}', None, [],
        id="json-answer-not-a-call"),
    P(PROSE, {}, PROSE, None, [], id="prose-with-tag-prefixes"),
    P(BROKEN, {}, " sorry", None, [("get_weather", {})], id="broken-named-call-is-kept"),
    P(TRUNCATED, {}, "Checking.", None, [("get_weather", "")], id="truncated-named-call-kept"),
    P(TRUNCATED_JSON, {}, TRUNCATED_JSON, None, [], id="truncated-json-stays-content"),
    P("[TOOL_CALLS] but then prose", {}, "[TOOL_CALLS] but then prose", None, [],
        id="mistral-marker-then-prose"),
    P("<think>\nStill thinking when the budget ran out", {}, "",
        "Still thinking when the budget ran out", [], id="unclosed-think"),
    P("<think>\n\n</think>\n\nHi.", {}, "Hi.", None, [], id="empty-think-dropped"),
    P("<think>\nplan\n</think>\n\nHi.", {"reasoning_format": "none"},
        "<think>\nplan\n</think>\n\nHi.", None, [], id="reasoning-none"),
    P("<think>\nplan\n</think>\n\nHi.", LEGACY, "<think>plan</think>Hi.", "plan", [],
        id="deepseek-legacy"),
    P("plan\n</think>\nHi.", {**LEGACY, "thinking_forced_open": True}, "<think>plan</think>Hi.",
        "plan", [], id="deepseek-legacy-forced-open"),
    P("[THINK]Check units.[/THINK]42 km", {"template_source": "[THINK] [/THINK]"}, "42 km",
        "Check units.", [], id="magistral-think-tags"),
    P(QWEN_PARALLEL, {"tools": False}, QWEN_PARALLEL, None, [], id="tools-off-stays-content"),
    P('{"name": "Bob", "arguments": {}}', {"tool_names": ["get_weather"]},
        '{"name": "Bob", "arguments": {}}', None, [], id="unknown-tool-name-stays-content"),
]
# fmt: on


@pytest.mark.parametrize(("text", "kwargs", "content", "reasoning", "expected"), CASES)
def test_whole_output(text, kwargs, content, reasoning, expected):
    message = parse(text, **kwargs)
    assert message.content == content
    assert message.reasoning_content == reasoning
    assert calls(message) == expected
    for call, (_, arguments) in zip(message.tool_calls, expected, strict=True):
        assert call.id  # arguments are JSON text but those of a call cut short
        assert isinstance(arguments, str) or json.loads(call.arguments) is not None


@pytest.mark.parametrize(("text", "kwargs", "content", "reasoning", "expected"), CASES)
def test_stream_matches_whole(text, kwargs, content, reasoning, expected):
    for sizes in chunkings(text):
        deltas, message = stream(text, sizes, **kwargs)
        assert assemble(deltas) == message
        assert message.content == content
        assert message.reasoning_content == reasoning
        assert calls(message) == expected
        assert all(d.content or d.reasoning_content or d.tool_calls for d in deltas)


def test_model_ids_are_kept_and_missing_ones_generated():
    message = parse(MISTRAL_NEMO)
    assert [c.id for c in message.tool_calls] == ["a1b2C3d4E", "Zz9Yy8Xx7"]
    message = parse(MISTRAL_SMALL)
    generated, given = message.tool_calls
    assert given.id == "abc123xyz"
    assert len(generated.id) == 32 and generated.id.isalnum()
    assert len(random_string()) == 32 and random_string() != random_string()


def test_arguments_are_compact_json_text():
    message = parse(QWEN3_THINK_CALL)
    assert message.tool_calls[0].arguments == '{"location":"Paris, France","unit":"celsius"}'
    message = parse(MISTRAL_NEMO)
    assert message.tool_calls[1].arguments == "{}"


def test_tool_call_deltas_have_openai_shape():
    deltas, _ = stream(QWEN_PARALLEL, [1] * len(QWEN_PARALLEL))
    tool_deltas = [tc for d in deltas for tc in d.tool_calls]
    first, second = (tc for tc in tool_deltas if tc.id is not None)
    assert (first.index, first.name, first.arguments) == (0, "get_weather", "")
    assert (second.index, second.name, second.arguments) == (1, "get_time", "")
    pieces = [tc for tc in tool_deltas if tc.id is None]
    assert all(tc.name is None and tc.arguments for tc in pieces)
    assert "".join(tc.arguments for tc in pieces if tc.index == 0) == \
        '{"location":"Paris, France"}'
    assert len([tc for tc in pieces if tc.index == 0]) > 3  # in pieces, as written


def test_partial_tags_are_held_back_then_released():
    parser = ChatOutputParser(reasoning_format="auto", tools=True)
    assert parser.feed("Hello") == [ChatDelta(content="Hello")]
    assert parser.feed(" <tool") == []  # might be <tool_call>
    assert parser.feed("ing> is") == [ChatDelta(content=" <tooling> is")]
    assert parser.feed(" \n") == []  # trailing whitespace waits for more content
    assert parser.flush() == [ChatDelta(content=" \n")]


def test_reasoning_is_streamed_before_the_end_tag():
    parser = ChatOutputParser(reasoning_format="deepseek", tools=False)
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nStep one") == [ChatDelta(reasoning_content="Step one")]
    assert parser.feed(", step two </th") == [ChatDelta(reasoning_content=", step two")]
    assert parser.feed("ink>\n\nDone") == [ChatDelta(content="Done")]
    assert parser.finish() == ChatMessage("Done", "Step one, step two", [])


def test_no_content_leaks_before_a_call():
    text = "Sure.\n" + QWEN_PARALLEL
    deltas, message = stream(text, [1] * len(text))
    assert "".join(d.content for d in deltas) == "Sure."
    assert len(message.tool_calls) == 2


def test_content_after_a_call_is_kept():
    message = parse(HERMES_WITH_TEXT.rstrip() + "\nDone.")
    assert message.content == "I'll look up Tesla's fundamentals for you.\nDone."
    assert len(message.tool_calls) == 1


def test_generic_grammar_output_round_trips():
    tools = validate_tools(
        [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            },
        ]
    )
    schema, _ = tool_call_grammar(tools, "required", parallel_tool_calls=False)
    assert schema is not None
    output = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Lyon"}}}'
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(output), json.loads(schema))
    assert calls(parse(output)) == [("get_weather", {"city": "Lyon"})]


def test_unknown_reasoning_format_is_a_400():
    with pytest.raises(InvalidRequest, match="Unknown reasoning format: deep"):
        ChatOutputParser(reasoning_format="deep", tools=False)
    assert check_reasoning_format("deepseek-legacy") == "deepseek-legacy"


def test_thinking_forced_open_detection():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt_opens_thinking("[INST]hi[/INST][THINK]", "{{ '[THINK]' }}")
    assert reasoning_tags("") == ("<think>", "</think>")


def test_feed_after_finish_is_an_error():
    parser = ChatOutputParser(reasoning_format="none", tools=False)
    parser.feed("x")
    assert parser.finish() == parser.finish() == ChatMessage("x", None, [])
    with pytest.raises(RuntimeError):
        parser.feed("y")


@pytest.mark.parametrize(
    ("text", "end", "failed"),
    [
        ('{"a": [1, 2.5e3, true, null, "x\\"}"]} tail', 37, False),
        ("[{}, []]", 8, False),
        ("{a}", None, True),
        ("[1 2]", None, True),
        ('{"a": tru', None, False),
        ('{"a": trux}', None, True),
        ("[1,]", None, True),
    ],
)
def test_json_scanner(text, end, failed):
    scanner = JsonScanner()
    scanner.feed(text)
    assert (scanner.end, scanner.failed) == (end, failed)


def test_long_stream_is_fast():
    text = ("word <b>bold</b> [x] {y} " * 800) + QWEN_PARALLEL
    started = time.perf_counter()
    deltas, message = stream(text, [3] * (len(text) // 3 + 1))
    assert time.perf_counter() - started < 3
    assert len(message.tool_calls) == 2
    assert assemble(deltas) == message


FRAGMENTS = [
    "Hello",
    " ",
    "\n",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"tool_calls": [{"name": "g", "arguments": {}}]}',
    "[TOOL_CALLS]",
    "get_time[ARGS]",
    "[1, 2]",
    "{",
    "}",
    "<",
    "[",
    "<|python_tag|>",
    "<function=h>",
    "</function>",
    ";",
    "<tool",
    "é✓",
]


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_stream_matches_whole(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14)))
    for kwargs in (
        {"reasoning_format": "auto", "tools": True},
        {"reasoning_format": "deepseek-legacy", "tools": True, "thinking_forced_open": True},
        {"reasoning_format": "none", "tools": True},
        {"reasoning_format": "deepseek", "tools": False},
    ):
        whole = parse(text, **kwargs)
        for sizes in chunkings(text):
            deltas, message = stream(text, sizes, **kwargs)
            assert assemble(deltas) == message
            assert (message.content, message.reasoning_content, calls(message)) == (
                whole.content,
                whole.reasoning_content,
                calls(whole),
            ), (text, sizes, kwargs)


def test_reasoning_none_keeps_the_prompts_opening_tag():
    """As llama-server answers DeepSeek-R1 and MiniMax-M2 (their prompts end with `<think>\\n`)
    with reasoning_format none: the content starts with what the prompt opened."""
    message = parse("hm\n</think>\n\nok", reasoning_format="none", thinking_forced_open=True,
                    opened="<think>\n")
    assert message.content == "<think>\nhm\n</think>\n\nok"
    deltas, _ = stream("hm\n</think>\n\nok", [1] * 20, reasoning_format="none",
                       thinking_forced_open=True, opened="<think>\n")
    assert assemble(deltas).content == message.content
