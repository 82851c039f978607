"""The built-in chat templates (`--chat-template NAME`) against llama.cpp's own output.

EXPECTED holds what llama.cpp's `llm_chat_apply_template` (src/llama-chat.cpp, the version
llama-cpp-python 0.3.36 vendors) writes for the conversation of its tests/test-chat-template.cpp,
with the generation prompt. When llama_cpp is installed (the worker's venv), the templates are
also compared with it directly on more conversations.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import pytest

from api.chat.builtin import BUILTIN_TEMPLATES, builtin_template_names, detect_builtin_template
from api.chat.templates import ChatTemplate
from tests.paths import DATA

CONVERSATION = [
    ("system", "You are a helpful assistant"),
    ("user", "Hello"),
    ("assistant", "Hi there"),
    ("user", "Who are you"),
    ("assistant", "   I am an assistant   "),
    ("user", "Another question"),
]

SPEC_LIST = (  # the list in the spec's --chat-template help
    "bailing, bailing-think, bailing2, chatglm3, chatglm4, chatml, command-r, deepseek, "
    "deepseek-ocr, deepseek2, deepseek3, exaone-moe, exaone3, exaone4, falcon3, gemma, gigachat, "
    "glmedge, gpt-oss, granite, granite-4.0, granite-4.1, grok-2, hunyuan-dense, hunyuan-moe, "
    "hunyuan-vl, kimi-k2, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, llama4, "
    "megrez, minicpm, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, "
    "monarch, openchat, orion, pangu-embedded, phi3, phi4, rwkv-world, seed_oss, smolvlm, "
    "solar-open, vicuna, vicuna-orca, yandex, zephyr"
)

EXPECTED: dict[str, str] = json.loads(
    (DATA / "chat_builtin_outputs.json").read_text())
"""What llama.cpp's llama_chat_apply_template writes for CONVERSATION, by template name."""


def messages(conversation: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"role": role, "content": content} for role, content in conversation]


def test_every_name_of_the_spec_is_built_in() -> None:
    assert ", ".join(builtin_template_names()) == SPEC_LIST
    assert sorted(EXPECTED) == builtin_template_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_renders_what_llama_cpp_writes(name: str) -> None:
    template = ChatTemplate.builtin_named(name)
    assert template.render(messages(CONVERSATION)) == EXPECTED[name]


def test_builtin_without_generation_prompt() -> None:
    chatml = ChatTemplate.builtin_named("chatml")
    text = chatml.render(messages(CONVERSATION[:3]), add_generation_prompt=False,
                         continue_final_message=False)
    assert text == ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                    "<|im_start|>user\nHello<|im_end|>\n"
                    "<|im_start|>assistant\nHi there<|im_end|>\n")


# --- against llama.cpp itself, when it is installed ------------------------------------------

MORE_CONVERSATIONS = [
    CONVERSATION,
    CONVERSATION[1:],
    CONVERSATION[:-1],
    [("user", " padded\n")],
    [("system", " one "), ("system", "two"), ("user", "u")],
    [("user", "q"), ("assistant", ""), ("tool", '{"t": 1}'), ("user", "z")],
    [("assistant", "first"), ("user", "second")],
    [("user", "quotes ' \" and \\ and\n\nnewlines")],
    [("system", "s"), ("user", "ü ñ 日本語"), ("assistant", "x"), ("user", "y")],
]


def llama_cpp_apply(llama_cpp: Any, name: str, conversation: list[tuple[str, str]],
                    add_generation_prompt: bool) -> str:
    chat = (llama_cpp.llama_chat_message * len(conversation))()
    for index, (role, content) in enumerate(conversation):
        chat[index].role = role.encode()
        chat[index].content = content.encode()
    buffer = ctypes.create_string_buffer(1 << 16)
    size = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(conversation),
                                               add_generation_prompt, buffer, 1 << 16)
    assert size >= 0
    return buffer.raw[:size].decode()


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_matches_llama_cpp(name: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    template = ChatTemplate.builtin_named(name)
    for conversation in MORE_CONVERSATIONS:
        for add in (True, False):
            expected = llama_cpp_apply(llama_cpp, name, conversation, add)
            assert template.render(messages(conversation), add_generation_prompt=add,
                                   continue_final_message=False) == expected, conversation


# --- detection (used under --no-jinja) -------------------------------------------------------

@pytest.mark.parametrize(("source", "name"), [
    ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
     "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}", "chatml"),
    ("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
     "gemma"),
    ("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", "llama3"),
    ("{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
     "{% endfor %}", "llama2"),
    ("{{ '[SYSTEM_PROMPT]' + system + '[/SYSTEM_PROMPT]' }}{{ '[INST]' }}", "mistral-v7"),
    ("<|im_start|>{{ role }}<|im_sep|>", "phi4"),
    ("{{ '<|user|>\\n' + content + '<|end|>' }}{{ '<|assistant|>' }}", "phi3"),
    ("<|start|>{{ role }}<|channel|>final<|message|>", "gpt-oss"),
    ("<｜User｜>{{ c }}<｜Assistant｜>{{ a }}<｜end▁of▁sentence｜>", "deepseek3"),
    ("llama3", "llama3"),
    ("{{ messages }}", None),
])
def test_detect_builtin_template(source: str, name: str | None) -> None:
    assert detect_builtin_template(source) == name
