"""Chat templates: which one applies, the Jinja helpers, message normalization, prefill, errors.

(The built-in templates' exact outputs are in test_chat_builtin_templates.py.)
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from api.chat.builtin import builtin_template_names
from api.chat.templates import (
    ChatTemplate,
    reported_source,
    template_kwargs,
    validate_chat_template_setting,
)
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest, ServerError
from scheduler.registry import ModelMeta

CHATML_SOURCE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                 "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# google/gemma-7b-it's template, from llama.cpp's tests/test-chat-template.cpp
GEMMA_7B_IT = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
               "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == "
               "'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must "
               "alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role']"
               " == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = "
               "message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
               "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
               "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
# mlabonne/AlphaMonarch-7B's (writes bos_token itself)
MONARCH = ("{% for message in messages %}{{bos_token + message['role'] + '\\n' + "
           "message['content'] + eos_token + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ bos_token + 'assistant\\n' }}{% endif %}")
# the tool-call part of Qwen2.5's template: wants arguments as objects
QWEN_TOOL_CALLS = ("{%- for m in messages %}{%- for tc in m.tool_calls or [] %}"
                   "{{- '{\"name\": \"' + tc.function.name + '\", \"arguments\": ' }}"
                   "{{- tc.function.arguments | tojson }}}{%- endfor %}{%- endfor %}")
RAW_TOOL_CALLS = ("{%- for m in messages %}{%- for tc in m.tool_calls or [] %}"
                  "{{- tc.function.arguments }}{%- endfor %}{%- endfor %}")

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]


def settings(*argv: str) -> ApiSettings:
    return ApiSettings.from_args(list(argv), environ={})


def meta(chat_template: str | None = None, bos: str = "<s>", eos: str = "</s>") -> ModelMeta:
    return ModelMeta(vocab_type=1, n_vocab=32000, n_ctx_train=4096, n_embd=512, n_params=1,
                     size=1, chat_template=chat_template, bos_token=bos, eos_token=eos)


def jinja(source: str, bos: str = "", eos: str = "") -> ChatTemplate:
    return ChatTemplate("model", source, bos_token=bos, eos_token=eos)


def chatml() -> ChatTemplate:
    return ChatTemplate.builtin_named("chatml")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- which template applies --------------------------------------------------------------------

# llama.cpp's common/chat.cpp CHATML_TEMPLATE_SRC, as llama-server's /props shows it (the C
# string's \n inside the Jinja string literals are newlines)
LLAMA_CPP_CHATML = """{%- for message in messages -%}
  {{- '<|im_start|>' + message.role + '
' + message.content + '<|im_end|>
' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant
' -}}
{%- endif -%}"""


def test_props_shows_the_template_as_llama_server(tmp_path: Path) -> None:
    """/props `chat_template` (llama.cpp's UI reads it for thinking and the model's info):
    llama.cpp's chatml source for a model without one (it was "" before), the model's own, or
    what --chat-template / --chat-template-file give."""
    assert reported_source(settings(), meta(None)) == LLAMA_CPP_CHATML
    assert reported_source(settings("--chat-template", "chatml"), meta(GEMMA_7B_IT)) \
        == LLAMA_CPP_CHATML
    assert reported_source(settings(), meta(GEMMA_7B_IT)) == GEMMA_7B_IT
    assert reported_source(settings("--chat-template", "llama3"), meta(None)) == "llama3"
    assert reported_source(settings("--chat-template", MONARCH), meta(None)) == MONARCH
    file = tmp_path / "t.jinja"
    file.write_text(RAW_TOOL_CALLS)
    assert reported_source(settings("--chat-template-file", str(file)), meta(None)) \
        == RAW_TOOL_CALLS
    assert reported_source(settings("--chat-template-file", str(tmp_path / "no")), None) == ""

def test_default_is_chatml_without_a_model_template() -> None:
    for model in (None, meta(None)):
        template = ChatTemplate.for_model(settings(), model)
        assert template.name == "chatml"
        assert template.render([user("hi")]) == ("<|im_start|>user\nhi<|im_end|>\n"
                                                 "<|im_start|>assistant\n")


def test_the_models_own_template() -> None:
    template = ChatTemplate.for_model(settings(), meta(GEMMA_7B_IT))
    assert template.name == "model"
    assert template.source == GEMMA_7B_IT
    assert template.render([user("hi")]) == ("<start_of_turn>user\nhi<end_of_turn>\n"
                                             "<start_of_turn>model\n")


def test_chat_template_name_overrides_the_model() -> None:
    template = ChatTemplate.for_model(settings("--chat-template", "llama3"), meta(GEMMA_7B_IT))
    assert template.name == "llama3"
    assert template.render([user("hi")]) == ("<|start_header_id|>user<|end_header_id|>\n\nhi"
                                             "<|eot_id|><|start_header_id|>assistant"
                                             "<|end_header_id|>\n\n")


def test_chat_template_can_be_a_jinja_string() -> None:
    source = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    template = ChatTemplate.for_model(settings("--chat-template", source), meta(GEMMA_7B_IT))
    assert template.render([user("hi")]) == "[user:hi]"


def test_chat_template_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}<{{ m.content }}>{% endfor %}", "utf-8")
    template = ChatTemplate.for_model(
        settings("--chat-template-file", str(path), "--chat-template", "llama3"), meta(MONARCH))
    assert template.name == "chat-template-file"
    assert template.render([user("hi")]) == "<hi>"


def test_no_jinja_keeps_builtins_and_detects_the_models_template() -> None:
    template = ChatTemplate.for_model(settings("--no-jinja", "--chat-template", "phi3"), None)
    assert template.render([user("hi")]) == "<|user|>\nhi<|end|>\n<|assistant|>\n"
    detected = ChatTemplate.for_model(settings("--no-jinja"), meta(GEMMA_7B_IT))
    assert detected.name == "gemma"
    with pytest.raises(ServerError, match="--jinja"):
        ChatTemplate.for_model(settings("--no-jinja"), meta("{{ messages[0].content }}"))


def test_a_broken_model_template_is_a_server_error() -> None:
    with pytest.raises(ServerError, match="chat template"):
        ChatTemplate.for_model(settings(), meta("{% for m in messages %}"))


# --- checks at start ---------------------------------------------------------------------------

def test_unknown_chat_template_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown chat template 'llama-9'") as caught:
        validate_chat_template_setting(settings("--chat-template", "llama-9"))
    message = str(caught.value)
    for name in builtin_template_names():
        assert name in message
    assert "chatml, command-r" in message


def test_create_app_refuses_an_unknown_chat_template() -> None:
    from api.app import create_app

    with pytest.raises(ValueError, match=r"built-in templates: .*gpt-oss"):
        create_app(settings("--chat-template", "nosuch"), "redis://127.0.0.1:1/0")


@pytest.mark.parametrize("argv", [
    (), ("--chat-template", "gemma"), ("--chat-template", "{{ messages }}"),
    ("--no-jinja", "--chat-template", "zephyr"), ("--no-jinja", "--chat-template", CHATML_SOURCE),
    ("--chat-template-kwargs", '{"enable_thinking": false}'),
])
def test_valid_chat_template_settings(argv: tuple[str, ...]) -> None:
    validate_chat_template_setting(settings(*argv))


@pytest.mark.parametrize(("argv", "error"), [
    (("--chat-template", "{% if %}"), "not valid Jinja"),
    (("--no-jinja", "--chat-template", "{{ messages }}"), "without --jinja"),
    (("--chat-template-file", "/no/such/file.jinja"), "cannot read"),
    (("--chat-template-kwargs", "{nope"), "not valid JSON"),
    (("--chat-template-kwargs", "[1]"), "JSON object"),
])
def test_invalid_chat_template_settings(argv: tuple[str, ...], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        validate_chat_template_setting(settings(*argv))


# --- rendering: llama.cpp's own jinja expectations ---------------------------------------------

def test_system_message_merged_when_the_template_refuses_it() -> None:
    # tests/test-chat-template.cpp, google/gemma-7b-it, expected_output_jinja
    assert jinja(GEMMA_7B_IT).render(CONVERSATION) == (
        "<start_of_turn>user\nYou are a helpful assistant\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you"
        "<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
        "<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n")


def test_leading_bos_token_is_removed() -> None:
    # AlphaMonarch's expected_output_jinja, less the leading "<s>" that the worker adds
    assert jinja(MONARCH, bos="<s>", eos="</s>").render(CONVERSATION) == (
        "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there"
        "</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\n"
        "Another question</s>\n<s>assistant\n")


def test_template_variables() -> None:
    source = ("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|"
              "{{ enable_thinking }}|{{ messages | length }}")
    template = jinja(source, bos="<B>", eos="<E>")
    assert template.render([user("x")], extra_context={"enable_thinking": False}) == (
        "|<E>|True||False|1")  # the leading <B> is removed; no tools: `tools` undefined
    tools = [{"type": "function", "function": {"name": "f"}}]
    text = template.render([user("x")], tools=tools, add_generation_prompt=False,
                           extra_context={"messages": [], "bos_token": "no"})
    assert text == f"|<E>|False|{tools}||1"


def test_date_variables_as_llama_cpp_sets_them() -> None:
    text = jinja("{{ date_string }}/{{ datetime }}").render([user("x")])
    today = datetime.now()
    assert text in (f"{today:%d %b %Y}/{today:%b %d %Y}",
                    f"{datetime.now():%d %b %Y}/{datetime.now():%b %d %Y}")


# --- helpers -----------------------------------------------------------------------------------

def test_tojson_like_transformers() -> None:
    value = {"b": "<é>", "a": [1, 2]}
    out = jinja("{{ v | tojson }}\n{{ v | tojson(indent=2, sort_keys=true) }}\n"
                "{{ v | tojson(ensure_ascii=true, separators=(',', ':')) }}").render(
        [user("x")], extra_context={"v": value})
    assert out.split("\n", 1)[0] == json.dumps(value, ensure_ascii=False)
    assert json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True) in out
    assert out.endswith(json.dumps(value, ensure_ascii=True, separators=(",", ":")))
    generator = jinja("{{ messages | map(attribute='role') | tojson }}").render([user("x")])
    assert generator == '["user"]'


def test_strftime_now() -> None:
    assert jinja("{{ strftime_now('%Y') }}").render([user("x")]) == str(datetime.now().year)


def test_raise_exception_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="Conversation roles must alternate"):
        jinja(GEMMA_7B_IT).render([user("a"), user("b")])


def test_loop_controls_and_generation_blocks() -> None:
    source = ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
              "{% if m.content == 'skip' %}{% continue %}{% endif %}"
              "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    assert jinja(source).render([user("skip"), user("a"), user("b")]) == "a"


def test_whitespace_control_like_transformers() -> None:
    source = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}"
    assert jinja(source).render([user("a"), user("b")]) == "    a\n    b\n"


def test_the_sandbox_holds() -> None:
    with pytest.raises(InvalidRequest):
        jinja("{{ messages.__class__.__mro__ }}").render([user("x")])


def test_templates_may_append_to_their_own_lists_only() -> None:
    source = "{% set ns = namespace(ids=[]) %}{% set _ = ns.ids.append(1) %}{{ ns.ids }}"
    assert jinja(source).render([user("x")]) == "[1]"
    given = [user("x")]
    jinja("{% set _ = messages.append(messages[0]) %}").render(given)
    assert given == [user("x")]


# --- messages ----------------------------------------------------------------------------------

def test_text_parts_are_joined_with_newlines() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "a"},
                                           {"type": "text", "text": "b"}]}
    assert chatml().render([message]) == ("<|im_start|>user\na\nb<|im_end|>\n"
                                          "<|im_start|>assistant\n")


def test_parts_kept_for_templates_that_only_read_parts() -> None:
    source = "{% for m in messages %}{% for p in m.content %}({{ p.text }}){% endfor %}{% endfor %}"
    assert jinja(source).render([user("plain")]) == "(plain)"


def test_media_parts_need_a_projector() -> None:
    image = {"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": "data:image/png;base64,AA"}}]}
    with pytest.raises(ServerError) as info:
        chatml().render([image])  # llama-server's 500 without a projector
    assert info.value.message == ("image input is not supported - hint: if this is "
                                  "unexpected, you may need to provide the mmproj")


@pytest.mark.parametrize(("messages", "error"), [
    ([], "non-empty"),
    ("hello", "non-empty"),
    (["hello"], "object"),
    ([{"content": "x"}], "Missing 'role'"),
    ([{"role": "user"}], "must contain 'content'"),
    ([user("x"), {"role": "assistant"}], "either 'content' or 'tool_calls'"),
    ([{"role": "user", "content": 5}], "Invalid 'content' type"),
    ([{"role": "user", "content": [{"type": "text"}]}], "Unsupported content part"),
    ([{"role": "user", "content": [{"type": "audio_file"}]}], "Unsupported content part"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}],
     "function name"),
])
def test_bad_messages_are_invalid_requests(messages: Any, error: str) -> None:
    with pytest.raises(InvalidRequest, match=error):
        chatml().render(messages)


def test_developer_is_system_except_for_gpt_oss_templates() -> None:
    developer = {"role": "developer", "content": "d"}
    assert chatml().render([developer, user("u")]).startswith("<|im_start|>system\nd")
    harmony = "{% for m in messages %}<|start|>{{ m.role }}<|channel|>{% endfor %}"
    assert jinja(harmony).render([developer, user("u")]).startswith("<|start|>developer")


def test_tool_messages_and_calls_reach_the_template() -> None:
    source = ("{% for m in messages %}{{ m.role }}:{{ m.content }}"
              "{% for tc in m.tool_calls or [] %}[{{ tc.id }} {{ tc.function.name }} "
              "{{ tc.function.arguments }}]{% endfor %}"
              "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}")
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [user("weather?"), {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert jinja(source).render(history) == ('user:weather?;assistant:[call_1 get_weather '
                                             '{"city": "Paris"}];tool:sunny(call_1);')


def test_tool_call_arguments_as_objects_when_the_template_wants_objects() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    history = [user("u"), {"role": "assistant", "content": "", "tool_calls": [call]}, user("v")]
    assert jinja(QWEN_TOOL_CALLS).render(history) == '{"name": "f", "arguments": {"x": 1}}'
    assert jinja(RAW_TOOL_CALLS).render(history) == '{"x": 1}'
    as_object = {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    history[1] = {"role": "assistant", "content": "", "tool_calls": [as_object]}
    assert jinja(RAW_TOOL_CALLS).render(history) == '{"x":1}'
    bad = {"type": "function", "function": {"name": "f", "arguments": "{not json"}}
    history[1] = {"role": "assistant", "content": "", "tool_calls": [bad]}
    with pytest.raises(InvalidRequest, match="arguments as JSON"):
        jinja(QWEN_TOOL_CALLS).render(history)


# --- prefill (a final assistant message is continued) ------------------------------------------

def test_final_assistant_message_is_continued() -> None:
    text = chatml().render([user("Tell me"), {"role": "assistant", "content": "Sure,"}])
    assert text == ("<|im_start|>user\nTell me<|im_end|>\n<|im_start|>assistant\nSure,")
    llama2 = ChatTemplate.builtin_named("llama2")
    assert llama2.render([user("Q"), {"role": "assistant", "content": "A"}]) == "[INST] Q [/INST]A"


def test_no_prefill_renders_the_message_closed() -> None:
    text = chatml().render([user("Tell me"), {"role": "assistant", "content": "Sure,"}],
                           continue_final_message=False)
    assert text == ("<|im_start|>user\nTell me<|im_end|>\n<|im_start|>assistant\nSure,"
                    "<|im_end|>\n<|im_start|>assistant\n")


def test_prefill_checks() -> None:
    answer = {"role": "assistant", "content": "A"}
    with pytest.raises(InvalidRequest, match="2 or more assistant messages"):
        chatml().render([user("Q"), answer, answer])
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(InvalidRequest, match="contains tool calls"):
        chatml().render([user("Q"), {"role": "assistant", "content": None, "tool_calls": [call]}])
    with pytest.raises(InvalidRequest, match="assistant message at the end"):
        chatml().render([user("Q")], continue_final_message=True)
    assert chatml().render([user("Q"), answer], continue_final_message=True).endswith("\nA")


THINKS = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|><think>{% endif %}")


def test_continue_final_message_modes() -> None:
    """As llama-server reads `continue_final_message`: true (the reasoning continued while the
    message has no content), "content" (the reasoning closed, the content continued),
    "reasoning_content" (the reasoning continued), another string (not continued)."""
    thinking = [user("Q"), {"role": "assistant", "content": "", "reasoning_content": "hm"}]
    template = jinja(THINKS)
    assert template.render_continued(thinking, continue_final_message=True)[1] == "hm"
    assert template.render_continued(thinking, continue_final_message="content")[1] == \
        "hm</think>"
    answered = [user("Q"), {"role": "assistant", "content": "A", "reasoning_content": "hm"}]
    assert template.render_continued(answered, continue_final_message="content")[1] == \
        "hm</think>A"
    assert template.render_continued(answered, continue_final_message="reasoning_content")[1] \
        == "hm"
    assert template.render_continued(answered, continue_final_message="other")[1] == ""


# --- template kwargs ---------------------------------------------------------------------------

def test_template_kwargs_defaults_and_overrides() -> None:
    assert template_kwargs(settings()) == {"enable_thinking": True, "preserve_reasoning": True}
    configured = settings("--reasoning", "off", "--reasoning-effort", "high",
                          "--no-reasoning-preserve", "--chat-template-kwargs", '{"a": 1}')
    assert template_kwargs(configured) == {"enable_thinking": False, "a": 1,
                                           "reasoning_effort": "high",
                                           "preserve_reasoning": False}
    merged = template_kwargs(configured, {"enable_thinking": True, "a": 2}, "low")
    assert merged["enable_thinking"] is True
    assert merged["a"] == 2
    assert merged["reasoning_effort"] == "low"
    off = template_kwargs(configured, None, "none")
    assert off["enable_thinking"] is False
    assert "reasoning_effort" not in off


def test_enable_thinking_must_be_a_boolean() -> None:
    with pytest.raises(InvalidRequest, match="enable_thinking"):
        template_kwargs(settings(), {"enable_thinking": "false"})


def test_a_string_plus_null_or_undefined_is_the_string() -> None:
    # llama.cpp's engine adds them so (Firefunction v2's template adds an undefined `functions`)
    source = "{{ 'a' + functions }}|{{ none + 'b' }}|{% for t in tools %}x{% endfor %}end"
    assert jinja(source).render([user("x")]) == "a|b|end"
