"""gpt-oss (harmony) output parsing, whole and streamed, on the family's real chat template
(tests/data/templates/openai-gpt-oss-120b.jinja, from the vendored llama.cpp) and on the outputs
of llama.cpp's own gpt-oss parser tests (tests/test-chat.cpp)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from api.chat.caps import chat_template_caps
from api.chat.harmony import PRESERVED_TOKENS, HarmonyParser, is_harmony_template
from api.chat.message import ChatDelta, ChatMessage, ToolCall
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.chat.reasoning_tags import reasoning_tags
from api.settings import ApiSettings
from scheduler.registry import ModelMeta
from tests.paths import DATA

TEMPLATES = DATA / "templates"
GPT_OSS = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text("utf-8")
OTHER_TEMPLATES = sorted(p for p in TEMPLATES.glob("*.jinja") if "gpt-oss" not in p.name)
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} tool",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}}}}
    for name in ("special_function", "get_weather")]


def parse(text: str, **kwargs) -> ChatMessage:
    kwargs.setdefault("reasoning_format", "auto")
    kwargs.setdefault("tools", True)
    kwargs.setdefault("prompt", "<|start|>assistant")
    parser = HarmonyParser(**kwargs)
    parser.feed(text)
    return parser.finish()


def assemble(deltas: list[ChatDelta]) -> ChatMessage:
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning_content for d in deltas)
    built: dict[int, list[str]] = {}
    for delta in deltas:
        for tc in delta.tool_calls:
            if tc.id is not None:
                assert tc.index not in built and tc.name and tc.arguments == ""
                built[tc.index] = [tc.id, tc.name, ""]
            else:
                built[tc.index][2] += tc.arguments
    return ChatMessage(content=content, reasoning_content=reasoning or None,
                       tool_calls=[ToolCall(*built[i]) for i in sorted(built)])


def streamed(text: str, sizes: list[int], **kwargs) -> tuple[ChatMessage, ChatMessage]:
    kwargs.setdefault("reasoning_format", "auto")
    kwargs.setdefault("tools", True)
    kwargs.setdefault("prompt", "<|start|>assistant")
    parser = HarmonyParser(**kwargs)
    deltas: list[ChatDelta] = []
    pos = 0
    for size in sizes:
        deltas += parser.feed(text[pos : pos + size])
        pos += size
    deltas += parser.flush()
    return assemble(deltas), parser.finish()


def calls(message: ChatMessage) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in message.tool_calls]


# (output, parser kwargs, content, reasoning, calls): llama.cpp's test-chat.cpp gpt-oss cases
THINKING = ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>"
            "final<|message|>Hello, world!\nWhat's up?")
CALL = [("special_function", {"arg1": 1})]
CASES = [
    ("<|channel|>final<|message|>Hello, world!\nWhat's up?", {},
     "Hello, world!\nWhat's up?", None, []),
    ("<|channel|>commentary<|message|>Hello, world!\nWhat's up?", {},
     "Hello, world!\nWhat's up?", None, []),
    (THINKING, {}, "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    (THINKING, {"reasoning_format": "none"},
     "<|channel|>analysis<|message|>I'm\nthinking<|end|>Hello, world!\nWhat's up?", None, []),
    ("<|channel|>analysis<|message|>I'm\nthinking", {}, "", "I'm\nthinking", []),
    (' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', {},
     "", None, CALL),
    ('<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}', {},
     "", None, CALL),
    (' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>'
     '{"arg1": 1}', {}, "", None, CALL),
    ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}', {},
     "", None, CALL),
    ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions."
     'special_function<|channel|>analysis<|message|>{"arg1": 1}', {}, "", "I'm\nthinking", CALL),
    ("<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant"
     "<|channel|>commentary to=functions.edit <|constrain|>json<|message|>"
     '{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", '
     '"replaceAll": false}', {"tool_names": ["edit"]}, "", "Thinking about edit...",
     [("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {",
                "replaceAll": False})]),
    ("<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|>"
     '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"amount": 123.45, '
     '"date": "2025-12-03"}', {"tools": False},
     '{"amount": 123.45, "date": "2025-12-03"}', "I need to output the invoice details in JSON",
     []),
    # unsolicited calls (built-in tools) are dropped
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>"
     "assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
     {"tools": False}, "", "I will execute python to say hello", []),
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>"
     "assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
     {"tools": False}, "", "I will execute python to say hello", []),
    # gpt-oss-20b's stray `<|channel|>commentary to=assistant`
    ("<|channel|>commentary to=assistant" + THINKING, {},
     "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    (THINKING.replace("<|start|>assistant", "<|start|>assistant<|channel|>commentary "
                      "to=assistant"), {}, "Hello, world!\nWhat's up?", "I'm\nthinking", []),
]


# a gpt-oss-20b answer as it comes out of llama.cpp with the harmony tokens kept: reasoning,
# a preamble, a call, ended by <|call|> (an end-of-generation token, so nothing after it)
AGENT_TURN = (
    "<|channel|>analysis<|message|>The user asks for the weather in Paris. We have a "
    "get_weather function taking arg1. We should call it.<|end|><|start|>assistant<|channel|>"
    "commentary<|message|>Checking the weather for you.<|end|><|start|>assistant<|channel|>"
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"arg1":75}<|call|>'
)
TWO_CALLS = (
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"arg1":1}'
    '<|call|><|start|>assistant<|channel|>commentary to=functions.special_function '
    '<|constrain|>json<|message|>{"arg1":2}<|call|>'
)


@pytest.mark.parametrize(("text", "kwargs", "content", "reasoning", "expected"), CASES)
def test_llama_cpp_cases(text, kwargs, content, reasoning, expected) -> None:
    message = parse(text, **kwargs)
    assert (message.content, message.reasoning_content, calls(message)) == \
        (content, reasoning, expected)


@pytest.mark.parametrize(("text", "kwargs", "content", "reasoning", "expected"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_stream_adds_up_to_the_whole(text, kwargs, content, reasoning, expected, seed) -> None:
    rng = random.Random(seed)
    sizes = [1] * len(text) if seed == 0 else [rng.randint(1, 12) for _ in range(len(text))]
    assembled, whole = streamed(text, sizes, **kwargs)
    assert (assembled.content, assembled.reasoning_content, calls(assembled)) == \
        (content, reasoning, expected)
    assert calls(whole) == expected and whole.content == content


def test_agent_turn_stream_and_whole() -> None:
    whole = parse(AGENT_TURN)
    assert (whole.reasoning_content or "").startswith("The user asks for the weather in Paris.")
    assert whole.content == "Checking the weather for you."
    assert calls(whole) == [("get_weather", {"arg1": 75})]
    assert len(whole.tool_calls[0].id) == 32
    assembled, _ = streamed(AGENT_TURN, [3] * len(AGENT_TURN))
    assert (assembled.content, assembled.reasoning_content, calls(assembled)) == \
        (whole.content, whole.reasoning_content, calls(whole))


def test_reasoning_is_streamed_before_its_end() -> None:
    parser = HarmonyParser(reasoning_format="auto", tools=False, prompt="<|start|>assistant")
    deltas = parser.feed("<|channel|>analysis<|message|>Let me think<|e")
    assert "".join(d.reasoning_content for d in deltas) == "Let me think"
    assert not any(d.content for d in deltas)  # `<|e` may be <|end|>: held back
    deltas = parser.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi")
    assert "".join(d.content for d in deltas) == "Hi"


def test_no_header_text_leaks_into_content() -> None:
    parser = HarmonyParser(reasoning_format="auto", tools=True, prompt="<|start|>assistant")
    out: list[ChatDelta] = []
    for piece in ("<|chan", "nel|>comm", "entary to=func", "tions.get_weather <|cons",
                  "train|>json<|message|>{\"arg1\"", ":3}"):
        out += parser.feed(piece)
        assert not any(d.content or d.reasoning_content for d in out)
    assert not any(d.tool_calls for d in out)  # emitted once the arguments are complete
    out += parser.flush()
    assert [tc.name for d in out for tc in d.tool_calls if tc.name] == ["get_weather"]


def test_deepseek_legacy_is_auto() -> None:
    """As llama-server answers gpt-oss (its binary, streamed and not): the reasoning is not
    copied into content."""
    message = parse(THINKING, reasoning_format="deepseek-legacy")
    assert message.reasoning_content == "I'm\nthinking"
    assert message.content == "Hello, world!\nWhat's up?"
    assembled, _ = streamed(THINKING, [2] * len(THINKING), reasoning_format="deepseek-legacy")
    assert (assembled.content, assembled.reasoning_content) == (message.content, "I'm\nthinking")


def test_whitespace_only_reasoning_is_dropped() -> None:
    text = "<|channel|>analysis<|message|> \n<|end|><|start|>assistant<|channel|>final<|message|>Hi"
    assert parse(text).reasoning_content is None
    assembled, _ = streamed(text, [1] * len(text))
    assert assembled.reasoning_content is None and assembled.content == "Hi"


def test_parallel_tool_calls() -> None:
    both = parse(TWO_CALLS, parallel_tool_calls=True)
    assert calls(both) == [("get_weather", {"arg1": 1}), ("special_function", {"arg1": 2})]
    assert both.tool_calls[0].id != both.tool_calls[1].id
    first = parse(TWO_CALLS, parallel_tool_calls=False)
    assert calls(first) == [("get_weather", {"arg1": 1})] and first.content == ""


def test_calls_only_for_known_tools_when_tools_are_parsed() -> None:
    text = '<|channel|>commentary to=functions.rm_rf<|message|>{"arg1": 1}'
    assert parse(text, tool_names=["get_weather"]).tool_calls == []
    assert parse(text, tools=False).tool_calls == []
    assert calls(parse(text)) == [("rm_rf", {"arg1": 1})]


def test_bad_arguments_stay_content() -> None:
    message = parse("<|channel|>commentary to=functions.get_weather<|message|>{oops<|call|>")
    assert message.tool_calls == [] and message.content == "{oops"


def test_text_without_channels_is_content() -> None:
    assert parse("Just text, no harmony.").content == "Just text, no harmony."
    text = "Plain<|start|>assistant<|channel|>final<|message|>then final"
    assert parse(text).content == "Plainthen final"
    assembled, _ = streamed(text, [1] * len(text))
    assert assembled.content == "Plainthen final"


def test_a_cut_off_header_is_dropped() -> None:
    assert parse("<|channel|>analysis<|message|>x<|end|><|start|>assist").content == ""
    assert parse("<|channel|>fin").content == ""


def test_feed_after_finish_is_an_error() -> None:
    parser = HarmonyParser(reasoning_format="auto", tools=False)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_prompt_that_opened_a_message_continues_it() -> None:
    prompt = "<|start|>assistant<|channel|>analysis<|message|>I'm"
    parser = HarmonyParser(reasoning_format="auto", tools=False, prompt=prompt)
    parser.feed(" thinking<|end|><|start|>assistant<|channel|>final<|message|>Hello")
    message = parser.finish()
    assert (message.reasoning_content, message.content) == (" thinking", "Hello")


def test_long_output_is_compacted_and_still_whole() -> None:
    body = "word " * 5000
    text = f"<|channel|>analysis<|message|>{body}<|end|><|start|>assistant<|channel|>final" \
           f"<|message|>{body}"
    assembled, whole = streamed(text, [7] * len(text))
    assert assembled.reasoning_content == body and assembled.content == body
    assert whole.content == body


# --- the real template: detection, rendering, the parser prepare_chat picks -------------------

def test_detection_on_real_templates() -> None:
    assert is_harmony_template(GPT_OSS)
    assert OTHER_TEMPLATES and not any(is_harmony_template(p.read_text("utf-8"))
                                       for p in OTHER_TEMPLATES)
    assert reasoning_tags(GPT_OSS) == ("<|channel|>analysis<|message|>", "<|end|>")
    assert all(token in GPT_OSS for token in PRESERVED_TOKENS if token != "<|constrain|>")


def _prepare(**request: Any) -> PreparedChat:
    settings = ApiSettings.from_args(["--jinja"], environ={})
    meta = ModelMeta(vocab_type=2, n_vocab=201088, n_ctx_train=131072, n_embd=2880,
                     n_params=1, size=1, chat_template=GPT_OSS, bos_token="<|startoftext|>",
                     eos_token="<|return|>")
    request.setdefault("tools", None)
    request.setdefault("tool_choice", None)
    return prepare_chat(settings, meta, ChatRequest(**request))


def test_prepare_chat_picks_the_harmony_parser() -> None:
    prepared = _prepare(messages=[{"role": "user", "content": "Weather in Paris?"}],
                        tools=TOOLS, parallel_tool_calls=None)
    assert prepared.prompt.endswith("<|start|>assistant")
    assert "namespace functions" in prepared.prompt
    parser = prepared.parser()
    assert isinstance(parser, HarmonyParser)
    assert prepared.preserved_tokens == list(PRESERVED_TOKENS)  # the worker writes them
    # llama-server's default: what the template allows (its caps: gpt-oss's renders only
    # one call of an assistant turn, so no parallel calls)
    assert chat_template_caps(GPT_OSS)["supports_parallel_tool_calls"] is False
    assert prepared.parallel_tool_calls is False
    parser.feed(TWO_CALLS)
    assert [c.name for c in parser.finish().tool_calls] == ["get_weather"]
    both = _prepare(messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                    parallel_tool_calls=True)
    assert [c.name for c in both.parse(TWO_CALLS).tool_calls] == ["get_weather",
                                                                   "special_function"]
    single = _prepare(messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                      parallel_tool_calls=False)
    assert [c.name for c in single.parse(TWO_CALLS).tool_calls] == ["get_weather"]
    none = _prepare(messages=[{"role": "user", "content": "x"}], reasoning_format="none")
    assert none.parse(THINKING).content.startswith("<|channel|>analysis<|message|>I'm")


def test_history_reasoning_is_rendered_as_thinking() -> None:
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "ignored beside calls",
                "reasoning_content": "Need the tool.",
                "tool_calls": [{"id": "1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"arg1": 1}'}}]},
               {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    prepared = _prepare(messages=history, tools=TOOLS)
    assert "<|channel|>analysis<|message|>Need the tool.<|end|>" in prepared.prompt
    assert "to=functions.get_weather" in prepared.prompt
