"""The agent families' tool-call formats, each on its real chat template (tests/data/templates,
from the vendored llama.cpp's models/templates): the template is detected, renders a prompt
with tools, and the parser prepare_chat picks reads the family's raw output, whole and streamed
in any chunking (the outputs are those of llama.cpp's tests/test-chat.cpp for the family, and
agent turns written the way the family writes them)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from api.chat.chat_formats import (
    COMMAND_R7B,
    FUNCTIONARY_V3_2,
    GENERIC,
    GLM_45,
    GPT_OSS,
    GRANITE,
    KIMI_K2,
    MINIMAX_M2,
    QWEN3_CODER,
    SEED_OSS,
    ChatFormat,
    detect_chat_format,
    preserved_tokens,
)
from api.chat.message import ChatDelta, ChatMessage, ToolCall
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.settings import ApiSettings
from scheduler.contract.jobs import CompletionJob
from scheduler.registry import ModelMeta
from tests.paths import DATA

TEMPLATES = DATA / "templates"


def tool(name: str, **properties: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": f"the {name} tool",
        "parameters": {"type": "object",
                       "properties": {k: {"type": t} for k, t in properties.items()},
                       "required": list(properties)}}}


TOOLS = [tool("special_function", arg1="integer"),
         tool("special_function_with_opt", arg1="integer", arg2="integer"),
         tool("get_weather", location="string", days="integer"),
         tool("write_file", path="string", content="string", overwrite="boolean"),
         tool("empty_args")]


def prepared(template: str, **request: Any) -> PreparedChat:
    source = (TEMPLATES / template).read_text("utf-8")
    meta = ModelMeta(vocab_type=2, n_vocab=1000, n_ctx_train=4096, n_embd=64, n_params=1,
                     size=1, chat_template=source, bos_token="<s>", eos_token="</s>")
    request.setdefault("messages", [{"role": "user", "content": "What's the weather in Paris?"}])
    request.setdefault("tools", TOOLS)
    request.setdefault("tool_choice", None)
    request.setdefault("reasoning_format", "auto")
    return prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta,
                        ChatRequest(**request))


def assemble(deltas: list[ChatDelta]) -> ChatMessage:
    built: dict[int, list[str]] = {}
    for delta in deltas:
        for tc in delta.tool_calls:
            if tc.id is not None:
                built[tc.index] = [tc.id, tc.name or "", ""]
            else:
                built[tc.index][2] += tc.arguments
    reasoning = "".join(d.reasoning_content for d in deltas)
    return ChatMessage(content="".join(d.content for d in deltas),
                       reasoning_content=reasoning or None,
                       tool_calls=[ToolCall(*built[i]) for i in sorted(built)])


def summary(message: ChatMessage) -> tuple[str, str | None, list[tuple[str, dict]]]:
    return (message.content, message.reasoning_content,
            [(c.name, json.loads(c.arguments)) for c in message.tool_calls])


def check(chat: PreparedChat, text: str, content: str, reasoning: str | None,
          calls: list[tuple[str, dict]]) -> ChatMessage:
    """Whole, then streamed in pieces of 1, random sizes, and all at once: the same answer."""
    whole = chat.parse(text)
    assert summary(whole) == (content, reasoning, calls)
    for seed in range(4):
        rng = random.Random(seed)
        parser = chat.parser()
        deltas: list[ChatDelta] = []
        pos = 0
        while pos < len(text):
            size = 1 if seed == 0 else rng.randint(1, 15)
            deltas += parser.feed(text[pos : pos + size])
            pos += size
        deltas += parser.flush()
        assert summary(assemble(deltas)) == (content, reasoning, calls)
    return whole


# --- detection -------------------------------------------------------------------------------

DETECTED: list[tuple[str, ChatFormat]] = [
    ("openai-gpt-oss-120b.jinja", GPT_OSS),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", COMMAND_R7B),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", GRANITE),
    ("GLM-4.6.jinja", GLM_45),
    ("moonshotai-Kimi-K2.jinja", KIMI_K2),
    ("Kimi-K2-Instruct.jinja", KIMI_K2),
    ("meetkai-functionary-medium-v3.2.jinja", FUNCTIONARY_V3_2),
    ("MiniMax-M2.jinja", MINIMAX_M2),
    ("ByteDance-Seed-OSS.jinja", SEED_OSS),
    ("Qwen3-Coder.jinja", QWEN3_CODER),
]


@pytest.mark.parametrize(("template", "expected"), DETECTED)
def test_each_family_is_detected_from_its_real_template(template, expected) -> None:
    source = (TEMPLATES / template).read_text("utf-8")
    assert detect_chat_format(source) is expected
    tokens = preserved_tokens(source)
    assert set(expected.markers) <= set(tokens)


def test_a_plain_template_is_generic() -> None:
    assert detect_chat_format("{% for m in messages %}{{ m.content }}{% endfor %}") is GENERIC


@pytest.mark.parametrize(("template", "expected"), DETECTED)
def test_each_real_template_renders_the_tools(template, expected) -> None:
    chat = prepared(template)
    assert "special_function" in chat.prompt or "special_function" in json.dumps(chat.tools)
    assert "Paris" in chat.prompt


# --- Command-R7B -----------------------------------------------------------------------------

R7B = "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja"


def test_command_r7b() -> None:
    chat = prepared(R7B)
    check(chat, "<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
          "Hello, world!\nWhat's up?", None, [])
    check(chat, "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello, "
          "world!\nWhat's up?<|END_RESPONSE|>", "Hello, world!\nWhat's up?", "I'm\nthinking", [])
    text = ("<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
            '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": '
            '{"arg1": 1}}\n]<|END_ACTION|>')
    whole = check(chat, text, "", "I'm\nthinking", [("special_function", {"arg1": 1})])
    assert whole.tool_calls[0].id == "0"  # the model's id is kept, as llama.cpp keeps it
    agent = ("<|START_THINKING|>The user wants Paris weather for 3 days; I will call "
             "get_weather.<|END_THINKING|><|START_ACTION|>[\n"
             '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
             '{"location": "Paris", "days": 3}},\n'
             '    {"tool_call_id": "1", "tool_name": "special_function", "parameters": '
             '{"arg1": 2}}\n]<|END_ACTION|>')
    check(chat, agent, "", "The user wants Paris weather for 3 days; I will call get_weather.",
          [("get_weather", {"location": "Paris", "days": 3}), ("special_function", {"arg1": 2})])


def test_command_r7b_reasoning_none_keeps_the_thinking_tags() -> None:
    chat = prepared(R7B, reasoning_format="none", tools=None)
    check(chat, "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>Hello"
          "<|END_RESPONSE|>", "<|START_THINKING|>I'm\nthinking<|END_THINKING|>Hello", None, [])


# --- Granite ---------------------------------------------------------------------------------

GRANITE_T = "ibm-granite-granite-3.3-2B-Instruct.jinja"


def test_granite() -> None:
    chat = prepared(GRANITE_T)
    check(chat, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, [])
    check(chat, "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
          "Hello, world!\nWhat's up?", "I'm\nthinking", [])
    check(chat, '<|tool_call|>[{"arguments": {"location": "Paris", "days": 2}, "name": '
          '"get_weather"}, {"arguments": {"arg1": 1}, "name": "special_function"}]', "", None,
          [("get_weather", {"location": "Paris", "days": 2}), ("special_function", {"arg1": 1})])


def test_granite_tool_call_marker_that_is_no_call_stays_content() -> None:
    chat = prepared(GRANITE_T)
    check(chat, "Use <|tool_call|> then a list", "Use <|tool_call|> then a list", None, [])


# --- GLM-4.5 / 4.6 ---------------------------------------------------------------------------

GLM = "GLM-4.6.jinja"


def test_glm() -> None:
    chat = prepared(GLM)
    check(chat, "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>"
          "\n</tool_call>", "", None, [("special_function", {"arg1": 1})])
    agent = ("<think>Paris weather, two days.</think>\nLet me check.\n<tool_call>get_weather\n"
             "<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"
             "</arg_key>\n<arg_value>2</arg_value>\n</tool_call><tool_call>"
             "special_function_with_opt<arg_key>arg1</arg_key><arg_value>1</arg_value>"
             "<arg_key>arg2</arg_key><arg_value>2</arg_value></tool_call>")
    check(chat, agent, "Let me check.", "Paris weather, two days.",
          [("get_weather", {"location": "Paris", "days": 2}),
           ("special_function_with_opt", {"arg1": 1, "arg2": 2})])
    check(chat, "<tool_call>empty_args</tool_call>", "", None, [("empty_args", {})])


def test_glm_string_parameters_stay_strings() -> None:
    chat = prepared(GLM)
    check(chat, "<tool_call>get_weather<arg_key>location</arg_key><arg_value>007</arg_value>"
          "<arg_key>days</arg_key><arg_value>7</arg_value></tool_call>", "", None,
          [("get_weather", {"location": "007", "days": 7})])


# --- Kimi-K2 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("template", ["moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja"])
def test_kimi_k2(template) -> None:
    chat = prepared(template)
    check(chat, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, [])
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
            '<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>')
    whole = check(chat, text, "", None, [("special_function", {"arg1": 1})])
    assert whole.tool_calls[0].id == "functions.special_function:0"
    agent = ("I'll check the weather and run the function.<|tool_calls_section_begin|>"
             "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
             '{"location": "Paris", "days": 1}<|tool_call_end|><|tool_call_begin|>'
             'functions.special_function:1<|tool_call_argument_begin|>{"arg1": 5}'
             "<|tool_call_end|><|tool_calls_section_end|>")
    whole = check(chat, agent, "I'll check the weather and run the function.", None,
                  [("get_weather", {"location": "Paris", "days": 1}),
                   ("special_function", {"arg1": 5})])
    assert [c.id for c in whole.tool_calls] == ["functions.get_weather:0",
                                                "functions.special_function:1"]


def test_kimi_k2_call_without_its_section() -> None:
    chat = prepared("Kimi-K2-Instruct.jinja")
    check(chat, "<|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>"
          '{"arg1": 1}<|tool_call_end|>', "", None, [("special_function", {"arg1": 1})])


# --- MiniMax-M2 ------------------------------------------------------------------------------

MINIMAX = "MiniMax-M2.jinja"


def test_minimax_m2() -> None:
    chat = prepared(MINIMAX)
    opened = chat.prompt.rstrip().endswith("<think>")
    head = "" if opened else "<think>"
    check(chat, head + "I'm\nthinking\n</think>\n\nHello, world!\nWhat's up?",
          "Hello, world!\nWhat's up?", "I'm\nthinking", [])
    check(chat, head + "Let's call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name="
          '"empty_args">\n</invoke>\n</minimax:tool_call>', "", "Let's call a tool:",
          [("empty_args", {})])
    check(chat, head + '\n</think>\n\n<minimax:tool_call>\n<invoke name="special_function">\n'
          '<parameter name="arg1">1</parameter>\n</invoke>\n</minimax:tool_call>', "", None,
          [("special_function", {"arg1": 1})])
    agent = (head + "Weather first, then the file.\n</think>\n\n<minimax:tool_call>\n"
             '<invoke name="get_weather">\n<parameter name="location">Paris</parameter>\n'
             '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="write_file">\n'
             '<parameter name="path">notes.txt</parameter>\n<parameter name="content">'
             'line 1\nline 2</parameter>\n<parameter name="overwrite">true</parameter>\n'
             "</invoke>\n</minimax:tool_call>")
    check(chat, agent, "", "Weather first, then the file.",
          [("get_weather", {"location": "Paris", "days": 3}),
           ("write_file", {"path": "notes.txt", "content": "line 1\nline 2",
                           "overwrite": True})])


# --- Seed-OSS --------------------------------------------------------------------------------

SEED = "ByteDance-Seed-OSS.jinja"


def test_seed_oss() -> None:
    chat = prepared(SEED)
    check(chat, "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, [])
    check(chat, "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
          "Hello, world!", "I'm thinking about the answer", [])
    check(chat, "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n"
          "</function>\n</seed:tool_call>", "", None, [("special_function", {"arg1": 1})])
    check(chat, "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n"
          "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=special_function_with_opt>"
          "\n<parameter=arg1>1</parameter>\n<parameter=arg2>2</parameter>\n</function>\n"
          "</seed:tool_call>", "", None,
          [("special_function", {"arg1": 1}), ("special_function_with_opt",
                                               {"arg1": 1, "arg2": 2})])


# --- Qwen3-Coder -----------------------------------------------------------------------------

CODER = "Qwen3-Coder.jinja"


def test_qwen3_coder() -> None:
    chat = prepared(CODER)
    agent = ("I'll write the file.\n<tool_call>\n<function=write_file>\n<parameter=path>\n"
             "src/main.py\n</parameter>\n<parameter=content>\nprint(\"hello\")\n</parameter>\n"
             "<parameter=overwrite>\ntrue\n</parameter>\n</function>\n</tool_call>")
    check(chat, agent, "I'll write the file.", None,
          [("write_file", {"path": "src/main.py", "content": 'print("hello")',
                           "overwrite": True})])


def test_qwen3_coder_numeric_looking_strings_stay_strings() -> None:
    """llama.cpp's StepFun/Qwen3-Coder case: a string parameter keeps "12345" as text."""
    chat = prepared(CODER)
    check(chat, "<tool_call>\n<function=write_file>\n<parameter=path>\n12345\n</parameter>\n"
          "<parameter=content>\n[1, 2]\n</parameter>\n<parameter=overwrite>\nfalse\n"
          "</parameter>\n</function>\n</tool_call>", "", None,
          [("write_file", {"path": "12345", "content": "[1, 2]", "overwrite": False})])


# --- Functionary v3.2 ------------------------------------------------------------------------

FUNCTIONARY = "meetkai-functionary-medium-v3.2.jinja"


def test_functionary_v3_2() -> None:
    chat = prepared(FUNCTIONARY)
    assert chat.prompt.endswith(">>>")
    check(chat, "all\nHello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, [])
    check(chat, 'special_function\n{"arg1": 1}', "", None, [("special_function", {"arg1": 1})])
    agent = ('all\nLet me look that up.>>>get_weather\n{"location": "Paris", "days": 2}'
             '>>>special_function\n{"arg1": 3}')
    check(chat, agent, "Let me look that up.", None,
          [("get_weather", {"location": "Paris", "days": 2}), ("special_function", {"arg1": 3})])
    single = prepared(FUNCTIONARY, parallel_tool_calls=False)
    check(single, agent, "Let me look that up.", None,
          [("get_weather", {"location": "Paris", "days": 2})])


def test_functionary_v3_2_text_that_is_no_call_stays_content() -> None:
    chat = prepared(FUNCTIONARY)
    check(chat, "get_weather\nnot json", "get_weather\nnot json", None, [])
    check(prepared(FUNCTIONARY, tools=[TOOLS[0]]), 'get_weather\n{"location": "Paris"}',
          'get_weather\n{"location": "Paris"}', None, [])
    check(chat, "Hello there, no recipient", "Hello there, no recipient", None, [])
    check(prepared(FUNCTIONARY, tools=None), 'special_function\n{"arg1": 1}',
          'special_function\n{"arg1": 1}', None, [])


@pytest.mark.parametrize(("template", "text"), [
    (SEED, "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n"
     "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=get_weather>\n"
     "<parameter=location>Rome</parameter>\n</function>\n</seed:tool_call>"),
    ("Kimi-K2-Instruct.jinja", "<|tool_calls_section_begin|><|tool_call_begin|>functions."
     'special_function:0<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|>'
     "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>"
     '{"location": "Rome"}<|tool_call_end|><|tool_calls_section_end|>'),
    (GLM, "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value>"
     "</tool_call><tool_call>get_weather<arg_key>location</arg_key><arg_value>Rome"
     "</arg_value></tool_call>"),
])
def test_parallel_tool_calls_off_keeps_the_first_call(template, text) -> None:
    both = prepared(template, parallel_tool_calls=True)
    check(both, text, "", None, [("special_function", {"arg1": 1}),
                                 ("get_weather", {"location": "Rome"})])
    first = prepared(template, parallel_tool_calls=False)
    check(first, text, "", None, [("special_function", {"arg1": 1})])


# --- no output breaks a parser ---------------------------------------------------------------

PIECES = ["<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather",
          "<|message|>", "<|end|>", "<|start|>assistant", "<|call|>", "<|constrain|>json",
          ">>>", "all\n", "get_weather\n", "<tool_call>", "</tool_call>", "<arg_key>",
          "</arg_key>", "<arg_value>", "</arg_value>", "<|tool_calls_section_begin|>",
          "<|tool_call_begin|>", "functions.get_weather:0", "<|tool_call_argument_begin|>",
          "<|tool_call_end|>", "<|tool_calls_section_end|>", "<minimax:tool_call>",
          '<invoke name="get_weather">', '<parameter name="days">', "</parameter>",
          "</invoke>", "</minimax:tool_call>", "<seed:tool_call>", "<function=get_weather>",
          "<parameter=days>", "</function>", "</seed:tool_call>", "<|START_ACTION|>",
          "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|tool_call|>",
          "<think>", "</think>", "<seed:think>", "</seed:think>", "<|START_THINKING|>",
          "<|END_THINKING|>", "<response>", '{"location": "Paris", "days": 2}', "[", "]", "{",
          '"', "2", "Paris", " ", "\n", "hello", "é"]


@pytest.mark.parametrize(("template", "expected"), DETECTED)
@pytest.mark.parametrize("seed", range(12))
def test_random_outputs_never_break_the_parser(template, expected, seed) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40)))
    chat = prepared(template)
    whole = chat.parse(text)
    parser = chat.parser()
    deltas: list[ChatDelta] = []
    pos = 0
    while pos < len(text):
        size = rng.randint(1, 8)
        deltas += parser.feed(text[pos : pos + size])
        pos += size
    deltas += parser.flush()
    assembled = assemble(deltas)
    assert (assembled.content, assembled.reasoning_content) == (whole.content,
                                                                whole.reasoning_content)
    assert [(c.name, c.arguments) for c in assembled.tool_calls] == \
        [(c.name, c.arguments) for c in whole.tool_calls]


# --- as llama-server's binary answers (side by side on a tiny GGUF, a grammar forcing the raw
# answer, each family's template): content and reasoning_content, auto and none --------------

SIDE_BY_SIDE = [  # (template, raw answer, format, llama-server's (content, reasoning_content))
    (R7B, "<|START_THINKING|>hm<|END_THINKING|><|START_RESPONSE|>ok<|END_RESPONSE|>", "auto",
     ("ok", "hm")),
    (R7B, "<|START_THINKING|>hm<|END_THINKING|><|START_RESPONSE|>ok<|END_RESPONSE|>", "none",
     ("<|START_THINKING|>hm<|END_THINKING|>ok", None)),
    (SEED, "<seed:think>hm</seed:think>ok", "auto", ("ok", "hm")),
    (SEED, "<seed:think>hm</seed:think>ok", "none", ("<seed:think>hm</seed:think>ok", None)),
    (GRANITE_T, "<think>hm</think><response>ok</response>", "auto",
     ("<response>ok</response>", "hm")),  # llama.cpp's test: response tags pending (a TODO)
    (GRANITE_T, "<think>hm</think><response>ok</response>", "none",
     ("<think>hm</think><response>ok</response>", None)),
    (MINIMAX, "hm</think>ok", "auto", ("ok", "hm")),
    (MINIMAX, "hm</think>ok", "none", ("<think>\nhm</think>ok", None)),  # the prompt opened it
    ("moonshotai-Kimi-K2.jinja", "<think>hm</think>ok", "auto", ("ok", "hm")),
    ("moonshotai-Kimi-K2.jinja", "<think>hm</think>ok", "none", ("<think>hm</think>ok", None)),
    (GLM, "<think>hm</think>ok", "auto", ("ok", "hm")),
    (GLM, "<think>hm</think>ok", "none", ("<think>hm</think>ok", None)),
    (CODER, "ok fine", "auto", ("ok fine", None)),
    (FUNCTIONARY, "all\nok fine", "auto", ("ok fine", None)),
    (FUNCTIONARY, "all\nok fine", "none", ("ok fine", None)),
]


@pytest.mark.parametrize(("template", "raw", "reasoning_format", "expected"), SIDE_BY_SIDE)
def test_as_llama_server_answers(template, raw, reasoning_format, expected) -> None:
    chat = prepared(template, tools=None, reasoning_format=reasoning_format)
    check(chat, raw, expected[0], expected[1], [])


# --- Ling 3 ----------------------------------------------------------------------------------

def test_ling3_stops_at_role_end_as_llama_server_adds_it() -> None:
    chat = prepared("inclusionai-ling-3.0-flash.jinja")
    job = CompletionJob(model="m", prompt=chat.prompt, stop=["x"])
    chat.fill(job)
    assert job.stop == ["x", "<|role_end|>"]
    check(chat, "Let me check.\n</think>\nOn it.\n<tool_call>get_weather\n<arg_key>location"
          "</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call><|role_end|>", "On it.",
          "Let me check.", [("get_weather", {"location": "Paris"})])


# --- tool_choice "required": the template's own format ----------------------------------------

def test_required_call_is_framed_in_the_templates_own_markers() -> None:
    hermes = prepared("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", tool_choice="required",
                      parallel_tool_calls=True)
    assert hermes.tool_frame == ["<tool_call>\n", "\n</tool_call>", "\n"]
    assert "Respond in JSON format" not in hermes.prompt  # no generic system line
    schema = json.loads(hermes.tool_schema or "")
    assert {c["properties"]["name"]["const"] for c in schema["anyOf"]} == {
        t["function"]["name"] for t in TOOLS}
    job = CompletionJob(model="m", prompt=hermes.prompt, json_schema=hermes.tool_schema)
    hermes.fill(job)
    assert job.json_schema_frame == hermes.tool_frame
    r7b = prepared(R7B, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                   parallel_tool_calls=False)
    assert r7b.tool_frame == ["<|START_ACTION|>", "<|END_ACTION|>", ""]
    schema = json.loads(r7b.tool_schema or "")
    assert schema["maxItems"] == 1
    assert set(schema["items"]["properties"]) == {"tool_call_id", "tool_name", "parameters"}


def test_required_call_of_a_family_llama_cpp_parses_itself_stays_generic() -> None:
    """DeepSeek V3.2's DSML (tagged pairs with a `string` attribute, llama.cpp's own parser
    and grammar): the generic JSON call is forced. GLM's tagged pairs, which llama.cpp's
    auto-parser reads, are forced in their markers (test_chat_auto_format.py)."""
    dsml = prepared("deepseek-ai-DeepSeek-V3.2.jinja", tool_choice="required")
    assert dsml.tool_frame is None
    assert "Respond in JSON format" in dsml.prompt
    assert "tool_calls" in json.loads(dsml.tool_schema or "")["properties"]  # parallel: a list


def test_a_forced_call_in_a_thinking_block_the_prompt_opened_is_a_call() -> None:
    qwq = prepared("Qwen-QwQ-32B.jinja", tool_choice="required", parallel_tool_calls=False)
    assert qwq.prompt.endswith("<think>\n") and qwq.tool_frame is not None
    check(qwq, '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n'
          "</tool_call>", "", None, [("get_weather", {"location": "Paris"})])
