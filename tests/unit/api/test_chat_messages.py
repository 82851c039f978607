"""OpenAI chat input validation (messages, tools, tool_choice) and the tool-call grammar."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.chat.messages import ChatMessageIn, arguments_as_objects, validate_messages
from api.chat.request_tools import NamedToolChoice, ToolChoice, validate_tool_choice, validate_tools
from api.chat.tool_grammar import GENERIC_TOOL_HINT_REQUIRED, add_system_hint, tool_call_grammar
from scheduler.contract.errors import InvalidRequest, NotSupported, ServerError

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
        "strict": True,
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


def test_a_tool_conversation_is_normalised():
    messages = validate_messages(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Paris?"},
                    {"type": "text", "text": "And the time?"},
                ],
                "name": "ann",
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Call both.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {"type": "function", "function": {"name": "get_time", "arguments": {}}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
            {"role": "assistant", "content": "18 C and sunny."},
        ]
    )
    assert messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?\nAnd the time?", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Call both.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "18 C and sunny."},
    ]
    objects = arguments_as_objects(messages)
    assert objects[3]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[3]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_models_are_accepted_too():
    message = ChatMessageIn.model_validate({"role": "user", "content": "hi"})
    assert validate_messages([message]) == [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="must contain 'content'"):
        validate_messages([ChatMessageIn(role="user")])


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "at least one message"),
        ("hello", "Expected 'messages' to be an array"),
        ({"role": "user"}, "Expected 'messages' to be an array"),
        (["hi"], "Expected 'message' to be an object"),
        ([{"content": "hi"}], "Missing 'role' in message"),
        ([{"role": "bot", "content": "hi"}], r'Invalid role "bot" in messages\[0\]'),
        ([{"role": "function", "content": "x"}], "expected one of system, developer, user"),
        ([{"role": "user"}], "All non-assistant messages must contain 'content'"),
        ([{"role": "system", "content": None}], r"messages\[0\], role 'system'"),
        (
            [{"role": "assistant"}],
            "Assistant message must contain either 'content' or 'tool_calls'",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "tool", "content": "42"}],
            r"messages\[1\]: a 'tool' message must have a 'tool_call_id'",
        ),
        ([{"role": "user", "content": 42}], "Expected 'content' to be a string or an array"),
        ([{"role": "user", "content": [{"text": "x"}]}], "Missing content part type"),
        (
            [{"role": "user", "content": [{"type": "audio", "data": "x"}]}],
            'Unsupported content part type: "audio"',
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            r"content\[0\]: a text part needs a string 'text'",
        ),
        (
            [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                }
            ],
            "only assistant messages may have 'tool_calls'",
        ),
        (
            [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}],
            r"messages\[0\]\.tool_calls\[0\]\.function\.name",
        ),
    ],
)
def test_bad_messages_are_400s(messages, match):
    with pytest.raises(InvalidRequest, match=match) as info:
        validate_messages(messages)
    assert info.value.status == 400 and info.value.error_type == "invalid_request_error"


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
        ({"type": "input_video", "input_video": {"url": "https://x/v.mp4"}}, "video"),
        ({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}, "video"),
    ],
)
def test_media_parts_need_a_multimodal_projector(part, kind):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    with pytest.raises(ServerError) as info:
        validate_messages(messages)
    # llama-server's answer, word for word: a 500
    assert info.value.status == 500 and info.value.error_type == "server_error"
    assert info.value.message == (f"{kind} input is not supported - hint: if this is "
                                  "unexpected, you may need to provide the mmproj")
    # the same part given as a parsed model
    with pytest.raises(ServerError):
        validate_messages([ChatMessageIn.model_validate(messages[0])])


def test_empty_messages_only_where_allowed():
    with pytest.raises(InvalidRequest, match="at least one message"):
        validate_messages([])
    assert validate_messages([], allow_empty=True) == []


def test_file_parts_are_not_supported():
    with pytest.raises(NotSupported, match="file input"):
        validate_messages(
            [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]
        )


def test_tools_are_normalised():
    tools = validate_tools([WEATHER_TOOL, TIME_TOOL])
    assert tools[0]["function"] == {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_TOOL["function"]["parameters"],
    }
    assert tools[1] == {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    assert validate_tools(None) == []


def _tool(parameters):
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("tools", "match"),
    [
        ({"type": "function"}, "Expected 'tools' to be an array"),
        (["f"], "expected an object"),
        ([{"function": {"name": "f"}}], "Missing tool type"),
        ([{"type": "retrieval", "function": {"name": "f"}}], "Unsupported tool type"),
        ([{"type": "function"}], "Missing tool function"),
        (
            [{"type": "function", "function": {"description": "no name"}}],
            r"tools\[0\]\.function\.name",
        ),
        ([{"type": "function", "function": {"name": " "}}], "name must not be empty"),
        ([_tool({"type": "string"})], "'parameters' must be a JSON schema of type 'object'"),
        ([_tool({"type": "array", "items": {}})], 'got type "array"'),
        ([_tool(["city"])], "'parameters' must be a JSON schema object"),
        ([_tool("object")], "'parameters' must be a JSON schema object"),
        ([_tool({"type": "object", "properties": ["city"]})], "properties' must be an object"),
        ([_tool({"type": "object", "required": "city"})], "required' must be an array"),
        ([TIME_TOOL, TIME_TOOL], "duplicate function name 'get_time'"),
    ],
)
def test_bad_tools_are_400s(tools, match):
    with pytest.raises(InvalidRequest, match=match):
        validate_tools(tools)


def test_tool_choice_values():
    tools = validate_tools([WEATHER_TOOL, TIME_TOOL])
    assert validate_tool_choice(None, tools) == ToolChoice("auto")
    assert validate_tool_choice("none", tools) == ToolChoice("none")
    assert validate_tool_choice("auto", []) == ToolChoice("auto")
    assert validate_tool_choice("required", tools) == ToolChoice("required")
    named = {"type": "function", "function": {"name": "get_time"}}
    assert validate_tool_choice(named, tools) == ToolChoice("required", "get_time")
    assert validate_tool_choice(NamedToolChoice.model_validate(named), tools).name == "get_time"
    responses_style = {"type": "function", "name": "get_weather"}
    assert validate_tool_choice(responses_style, tools) == ToolChoice("required", "get_weather")


@pytest.mark.parametrize(
    ("choice", "match"),
    [
        ("sometimes", "Invalid tool_choice: sometimes"),
        (3, "Invalid tool_choice: 3"),
        ({"type": "tool", "name": "get_time"}, "Invalid tool_choice"),
        ({"type": "function", "function": {"name": "launch"}}, "tool 'launch' is not in 'tools'"),
        ({"type": "function", "function": {}}, "no function name"),
    ],
)
def test_bad_tool_choice_is_a_400(choice, match):
    with pytest.raises(InvalidRequest, match=match):
        validate_tool_choice(choice, validate_tools([WEATHER_TOOL, TIME_TOOL]))


def test_required_needs_tools():
    with pytest.raises(InvalidRequest, match="needs at least one tool"):
        validate_tool_choice("required", [])


def test_no_grammar_unless_a_call_is_required():
    tools = validate_tools([WEATHER_TOOL])
    assert tool_call_grammar(tools, "auto", True) == (None, None)
    assert tool_call_grammar(tools, "none", True) == (None, None)
    assert tool_call_grammar(tools, None, False) == (None, None)
    assert tool_call_grammar([], ToolChoice("auto"), False) == (None, None)


def test_required_grammar_accepts_only_calls():
    jsonschema = pytest.importorskip("jsonschema")
    tools = validate_tools([WEATHER_TOOL, TIME_TOOL])
    text, hint = tool_call_grammar(tools, "required", False)
    assert text is not None and hint == GENERIC_TOOL_HINT_REQUIRED
    schema = json.loads(text)
    jsonschema.validate({"tool_call": {"name": "get_time", "arguments": {}}}, schema)
    jsonschema.validate(
        {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, schema
    )
    for bad in (
        {"response": "hi"},
        {"tool_call": {"name": "launch", "arguments": {}}},
        {"tool_call": {"name": "get_weather", "arguments": {}}},
        {"tool_calls": [{"name": "get_time", "arguments": {}}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_named_parallel_grammar():
    jsonschema = pytest.importorskip("jsonschema")
    tools = validate_tools([WEATHER_TOOL, TIME_TOOL])
    choice = {"type": "function", "function": {"name": "get_weather"}}
    text, hint = tool_call_grammar(tools, choice, parallel_tool_calls=True)
    assert text is not None and hint is not None and "tool_calls" in hint
    schema = json.loads(text)
    two = {"tool_calls": [{"name": "get_weather", "arguments": {"city": c}} for c in ("A", "B")]}
    jsonschema.validate(two, schema)
    bad: dict[str, Any]
    for bad in ({"tool_calls": []}, {"tool_calls": [{"name": "get_time", "arguments": {}}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_grammar_converts_to_gbnf():
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    tools = validate_tools([WEATHER_TOOL, TIME_TOOL])
    for parallel in (False, True):
        text, _ = tool_call_grammar(tools, ToolChoice("required"), parallel)
        gbnf = str(llama_grammar.json_schema_to_gbnf(text))
        assert "root ::=" in gbnf and '\\"get_weather\\"' in gbnf


def test_add_system_hint():
    hint = "Respond in JSON."
    user = {"role": "user", "content": "hi"}
    assert add_system_hint([user], hint) == [{"role": "system", "content": hint}, user]
    system = {"role": "system", "content": "Be brief."}
    assert add_system_hint([system, user], hint) == [
        {"role": "system", "content": "Be brief.\n\nRespond in JSON."},
        user,
    ]
