"""The auto-parser wired in: a template no family claims gets the tool-call reader its own
analysis derives (api/chat/autoparse/syntax.py), whole and streamed. Expected answers are
llama-server's (the vendored llama.cpp, the same raw output continued as the final assistant
message with max_tokens 0)."""

from __future__ import annotations

import json

import pytest

from api.chat.chat_formats import GENERIC, detect_chat_format, preserved_tokens
from api.chat.message import ChatMessage
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.settings import ApiSettings
from scheduler.registry import ModelMeta
from tests.chat_cases import assemble
from tests.paths import DATA

TOOLS: list[dict[str, object]] = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]
HY3 = "tencent-Hy3"
HY3_CALL = ("<tool_call:opensource>get_weather<tool_sep:opensource>\n"
            "<arg_key:opensource>city</arg_key:opensource>\n"
            "<arg_value:opensource>{city}</arg_value:opensource>\n{more}"
            "</tool_call:opensource>\n")
HY3_DAYS = ("<arg_key:opensource>days</arg_key:opensource>\n"
            "<arg_value:opensource>3</arg_value:opensource>\n")


def _source(name: str) -> str:
    return (DATA / "templates" / f"{name}.jinja").read_text("utf-8")


def _chat(name: str, parallel: bool | None = None, source: str | None = None) -> PreparedChat:
    source = source or _source(name)
    meta = ModelMeta(vocab_type=2, n_vocab=1000, n_ctx_train=4096, n_embd=64, n_params=1,
                     size=1, chat_template=source, bos_token="<s>", eos_token="</s>")
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                          tool_choice=None, parallel_tool_calls=parallel,
                          reasoning_format="auto")
    return prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta, request)


def _both(chat: PreparedChat, text: str) -> tuple[ChatMessage, ChatMessage]:
    parser = chat.parser()
    deltas = [d for ch in text for d in parser.feed(ch)]
    deltas += parser.flush()
    return chat.parse(text), assemble(deltas)


def _calls(message: ChatMessage) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in message.tool_calls]


@pytest.mark.parametrize(("text", "content", "calls"), [
    ("<tool_calls:opensource>\n" + HY3_CALL.format(city="Paris", more=HY3_DAYS)
     + HY3_CALL.format(city="Rome", more="") + "</tool_calls:opensource>", "",
     [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome"})]),
    ("Checking<tool_calls:opensource>\n" + HY3_CALL.format(city="Paris", more="")
     + "</tool_calls:opensource>", "Checking", [("get_weather", {"city": "Paris"})]),
])
def test_hy3_calls_from_its_own_analysis(text: str, content: str,
                                        calls: list[tuple[str, object]]) -> None:
    chat = _chat(HY3, parallel=True)
    for message in _both(chat, text):
        assert message.content == content
        assert _calls(message) == calls


def test_hy3_format_and_tokens() -> None:
    chat_format = detect_chat_format(_source(HY3))
    assert chat_format.name == "auto"
    assert chat_format.reasoning == ("<think:opensource>", "</think:opensource>")
    tokens = preserved_tokens(_source(HY3))
    assert {"<tool_calls:opensource>", "<tool_call:opensource>",
            "<arg_value:opensource>"} <= set(tokens)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                  "mistralai-Mistral-Nemo-Instruct-2407",
                                  "google-gemma-2-2b-it"])
def test_templates_the_generic_reader_reads_keep_it(name: str) -> None:
    assert detect_chat_format(_source(name)) is GENERIC


# Mistral Small 3.2's template with its markers renamed, so that no family claims it: a model
# writing `[FUNC_CALLS]name[CALL_REF]id[PARAMS]{…}`, read from the template's own analysis
CALL_ID_SOURCE = _source("Mistral-Small-3.2-24B-Instruct-2506").replace(
    "[TOOL_CALLS]", "[FUNC_CALLS]").replace("[CALL_ID]", "[CALL_REF]").replace("[ARGS]", "[PARAMS]")


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('[FUNC_CALLS]get_weather[CALL_REF]123456789[PARAMS]{"city": "Paris"}', "",
     [("get_weather", {"city": "Paris"}, "123456789")]),
    ('Hi[FUNC_CALLS]get_weather[CALL_REF]abcXYZ[PARAMS]{"city": "Paris"}'
     '[FUNC_CALLS]get_weather[CALL_REF]q9[PARAMS]{"city": "Rome", "days": 2}', "Hi",
     [("get_weather", {"city": "Paris"}, "abcXYZ"),
      ("get_weather", {"city": "Rome", "days": 2}, "q9")]),
    ('[FUNC_CALLS]get_weather[PARAMS]{"city": "Paris"}', "", [("get_weather", {"city": "Paris"},
                                                               None)]),
])
def test_call_ids_from_the_templates_own_analysis(text: str, content: str,
                                                  calls: list[tuple[str, object, str]]) -> None:
    """A call's id where the template writes one (the analysis' call-id markers), as the
    vendored llama.cpp reads these answers under this template (bench/chat_oracle); a call
    written without one gets one of ours. Before the call-id markers, all were content."""
    chat = _chat("", parallel=True, source=CALL_ID_SOURCE)
    assert detect_chat_format(CALL_ID_SOURCE).name == "auto"
    assert {"[FUNC_CALLS]", "[CALL_REF]", "[PARAMS]"} <= set(preserved_tokens(CALL_ID_SOURCE))
    for message in _both(chat, text):
        assert message.content == content
        got = [(c.name, json.loads(c.arguments), c.id) for c in message.tool_calls]
        assert [g[:2] for g in got] == [c[:2] for c in calls]
        for (_, _, ident), (_, _, want) in zip(got, calls, strict=True):
            assert ident == want if want is not None else ident


SOLAR = "upstage-Solar-Open-100B"
SPECIAL: dict[str, object] = {"type": "function", "function": {
    "name": "special_function", "parameters": {
        "type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}


def _forced(tools: list[dict[str, object]], choice: object,
            parallel: bool = False, template: str = SOLAR) -> PreparedChat:
    source = _source(template)
    meta = ModelMeta(vocab_type=2, n_vocab=1000, n_ctx_train=4096, n_embd=64, n_params=1,
                     size=1, chat_template=source, bos_token="<s>", eos_token="</s>")
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=tools,
                          tool_choice=choice, parallel_tool_calls=parallel,
                          reasoning_format="auto")
    return prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta, request)


@pytest.mark.parametrize(("tools", "choice"), [
    ([SPECIAL], "required"),
    ([SPECIAL, *TOOLS], {"type": "function", "function": {"name": "special_function"}}),
])
def test_a_forced_call_is_written_in_the_templates_own_format(tools: list[dict[str, object]],
                                                              choice: object) -> None:
    """tool_choice "required" (or a named function) under a template the auto-parser reads
    (Solar Open: a tagged name, JSON arguments) forces the call as llama.cpp's grammar for it
    does: `"<|tool_calls|>" "<|tool_call:begin|>" "call00001<|tool_call:name|>"
    "special_function" "<|tool_call:args|>" {arguments} "<|tool_call:end|>" "<|calls|>"`
    (bench/chat_oracle), with no system line; and the call so written is read back. Before,
    the generic {"tool_call": …} JSON was forced."""
    chat = _forced(tools, choice)
    assert chat.tool_frame == ["<|tool_calls|><|tool_call:begin|>call00001<|tool_call:name|>"
                               "special_function<|tool_call:args|>",
                               "<|tool_call:end|><|calls|>", ""]
    assert chat.tool_schema is not None
    assert json.loads(chat.tool_schema) == SPECIAL["function"]["parameters"]  # type: ignore[index]
    assert "Respond in JSON format" not in chat.prompt
    for message in _both(chat, chat.tool_frame[0] + '{"arg1": 1}' + chat.tool_frame[1]):
        assert message.content == ""
        assert _calls(message) == [("special_function", {"arg1": 1})]


@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_call_among_several_tools_offers_each_in_its_own_markers(parallel: bool) -> None:
    """Two tools under that template: each function is one alternative, written after the
    common markers in its own name's markers before its own arguments' schema (llama.cpp's
    grammar offers each function so: `tool-NAME` rules in one choice), and a call of either so
    written is read back. Before, the generic {"tool_call": …} JSON was forced, as the frame
    could name one function."""
    chat = _forced([SPECIAL, *TOOLS], "required", parallel=parallel)
    common, end = "<|tool_calls|><|tool_call:begin|>call00001<|tool_call:name|>", \
        "<|tool_call:end|><|calls|>"
    assert chat.tool_frame == [common, end, "", "special_function<|tool_call:args|>",
                               "get_weather<|tool_call:args|>"]
    assert chat.tool_schema is not None
    parameters = [t["function"]["parameters"] for t in [SPECIAL, *TOOLS]]  # type: ignore[index]
    assert json.loads(chat.tool_schema) == {"anyOf": parameters}
    assert "Respond in JSON format" not in chat.prompt
    for named, arguments, call in ((3, '{"arg1": 1}', ("special_function", {"arg1": 1})),
                                   (4, '{"city": "Rome"}', ("get_weather", {"city": "Rome"}))):
        for message in _both(chat, common + chat.tool_frame[named] + arguments + end):
            assert message.content == ""
            assert _calls(message) == [call]


def test_a_forced_call_with_tagged_arguments_is_written_in_its_own_markers() -> None:
    """Hy3 (a tagged name, tagged `<arg_key>`/`<arg_value>` pairs): tool_choice "required"
    forces the call in the template's markers, as llama.cpp's grammar does
    (`build_tool_parser_tag_tagged`): the function's schema carries the pairs' markers, the
    worker writes its arguments as those pairs (worker/engine/tagged_grammar.py), and a call so
    written is read back. Before, the generic {"tool_call": …} JSON was forced."""
    chat = _forced(TOOLS, "required", template=HY3)
    assert chat.tool_frame == ["<tool_calls:opensource>\n<tool_call:opensource>",
                               "</tool_call:opensource>\n</tool_calls:opensource>", "",
                               "get_weather<tool_sep:opensource>"]
    assert chat.tool_schema is not None
    assert json.loads(chat.tool_schema) == {"anyOf": [{
        **TOOLS[0]["function"]["parameters"],  # type: ignore[index]
        "x-llamaq-tagged-arguments": ["<arg_key:opensource>",
                                      "</arg_key:opensource>\n<arg_value:opensource>",
                                      "</arg_value:opensource>\n"]}]}
    assert "Respond in JSON format" not in chat.prompt
    written = (chat.tool_frame[0] + chat.tool_frame[3] + "\n<arg_key:opensource>city"
               "</arg_key:opensource>\n<arg_value:opensource>Rome</arg_value:opensource>\n"
               "<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>2"
               "</arg_value:opensource>\n" + chat.tool_frame[1])
    for message in _both(chat, written):
        assert message.content == ""
        assert _calls(message) == [("get_weather", {"city": "Rome", "days": 2})]


@pytest.mark.parametrize("template", [
    "GLM-4.6", "GLM-4.7-Flash", "ByteDance-Seed-OSS", "MiniMax-M2", "Spark2.5",
    "poolside-Laguna-S-2.1", "poolside-Laguna-XS.2", HY3])
def test_tagged_pairs_are_forced_in_their_markers_where_llama_cpp_auto_parses(
        template: str) -> None:
    """Every template llama.cpp's auto-parser reads whose arguments are tagged pairs (GLM 4.x,
    Seed-OSS, MiniMax-M2, …: no parser of llama.cpp's own) is forced in its markers, and a
    call as the grammar writes it (the markers, required pairs, closing markers) is read back
    by the template's parser. Before, the generic JSON call was forced."""
    chat = _forced(TOOLS, "required", template=template)
    assert chat.tool_frame is not None and "Respond in JSON format" not in chat.prompt
    key, between, end = json.loads(chat.tool_schema or "")["anyOf"][0][
        "x-llamaq-tagged-arguments"]
    written = (chat.tool_frame[0] + chat.tool_frame[3] + "\n" + key + "city" + between
               + "Paris, FR" + end + key + "days" + between + "3" + end + chat.tool_frame[1])
    for message in _both(chat, written):
        assert message.content.strip() == ""
        assert _calls(message) == [("get_weather", {"city": "Paris, FR", "days": 3})]
