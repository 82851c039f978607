"""The built-in chat templates (`--chat-template NAME`) against llama.cpp's own output.

EXPECTED holds what llama.cpp's `llm_chat_apply_template` (src/llama-chat.cpp, the version
llama-cpp-python 0.3.36 vendors) writes for the conversation of its tests/test-chat-template.cpp,
with the generation prompt. When llama_cpp is installed (the worker's venv), the templates are
also compared with it directly on more conversations.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from api.chat.builtin import BUILTIN_TEMPLATES, builtin_template_names, detect_builtin_template
from api.chat.templates import ChatTemplate

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

EXPECTED = {
    "bailing": (
        "<role>SYSTEM</role>You are a helpful assistant"
        "<role>HUMAN</role>Hello"
        "<role>ASSISTANT</role>Hi there"
        "<role>HUMAN</role>Who are you"
        "<role>ASSISTANT</role>   I am an assistant   "
        "<role>HUMAN</role>Another question"
        "<role>ASSISTANT</role>"
    ),
    "bailing-think": (
        "<role>SYSTEM</role>You are a helpful assistant"
        "<role>HUMAN</role>Hello"
        "<role>ASSISTANT</role>Hi there"
        "<role>HUMAN</role>Who are you"
        "<role>ASSISTANT</role>   I am an assistant   "
        "<role>HUMAN</role>Another question"
        "<role>ASSISTANT</role><think>"
    ),
    "bailing2": (
        "<role>SYSTEM</role>You are a helpful assistant"
        "<|role_end|><role>HUMAN</role>Hello"
        "<|role_end|><role>ASSISTANT</role>Hi there"
        "<|role_end|><role>HUMAN</role>Who are you"
        "<|role_end|><role>ASSISTANT</role>   I am an assistant   "
        "<|role_end|><role>HUMAN</role>Another question"
        "<|role_end|><role>ASSISTANT</role>"
    ),
    "chatglm3": (
        "[gMASK]sop<|system|>\n You are a helpful assistant"
        "<|user|>\n Hello"
        "<|assistant|>\n Hi there"
        "<|user|>\n Who are you"
        "<|assistant|>\n    I am an assistant   "
        "<|user|>\n Another question"
        "<|assistant|>"
    ),
    "chatglm4": (
        "[gMASK]<sop><|system|>\nYou are a helpful assistant"
        "<|user|>\nHello"
        "<|assistant|>\nHi there"
        "<|user|>\nWho are you"
        "<|assistant|>\n   I am an assistant   "
        "<|user|>\nAnother question"
        "<|assistant|>\n"
    ),
    "chatml": (
        "<|im_start|>system\nYou are a helpful assistant"
        "<|im_end|>\n<|im_start|>user\nHello"
        "<|im_end|>\n<|im_start|>assistant\nHi there"
        "<|im_end|>\n<|im_start|>user\nWho are you"
        "<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
        "<|im_end|>\n<|im_start|>user\nAnother question"
        "<|im_end|>\n<|im_start|>assistant\n"
    ),
    "command-r": (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    ),
    "deepseek": (
        "You are a helpful assistant"
        "### Instruction:\nHello"
        "\n### Response:\nHi there"
        "\n<|EOT|>\n### Instruction:\nWho are you"
        "\n### Response:\n   I am an assistant   "
        "\n<|EOT|>\n### Instruction:\nAnother question"
        "\n### Response:\n"
    ),
    "deepseek-ocr": (
        "You are a helpful assistant"
        "Hello"
        "Hi there"
        "Who are you"
        "   I am an assistant   "
        "Another question"
    ),
    "deepseek2": (
        "You are a helpful assistant"
        "\n\nUser: Hello"
        "\n\nAssistant: Hi there"
        "<｜end▁of▁sentence｜>User: Who are you"
        "\n\nAssistant:    I am an assistant   "
        "<｜end▁of▁sentence｜>User: Another question"
        "\n\nAssistant:"
    ),
    "deepseek3": (
        "You are a helpful assistant"
        "\n\n<｜User｜>Hello"
        "<｜Assistant｜>Hi there"
        "<｜end▁of▁sentence｜><｜User｜>Who are you"
        "<｜Assistant｜>   I am an assistant   "
        "<｜end▁of▁sentence｜><｜User｜>Another question"
        "<｜Assistant｜>"
    ),
    "exaone-moe": (
        "<|system|>\nYou are a helpful assistant"
        "<|endofturn|>\n<|user|>\nHello"
        "<|endofturn|>\n<|assistant|>\nHi there"
        "<|endofturn|>\n<|user|>\nWho are you"
        "<|endofturn|>\n<|assistant|>\nI am an assistant"
        "<|endofturn|>\n<|user|>\nAnother question"
        "<|endofturn|>\n<|assistant|>\n"
    ),
    "exaone3": (
        "[|system|]You are a helpful assistant"
        "[|endofturn|]\n[|user|]Hello"
        "\n[|assistant|]Hi there"
        "[|endofturn|]\n[|user|]Who are you"
        "\n[|assistant|]I am an assistant"
        "[|endofturn|]\n[|user|]Another question"
        "\n[|assistant|]"
    ),
    "exaone4": (
        "[|system|]You are a helpful assistant"
        "[|endofturn|]\n[|user|]Hello"
        "\n[|assistant|]Hi there"
        "[|endofturn|]\n[|user|]Who are you"
        "\n[|assistant|]I am an assistant"
        "[|endofturn|]\n[|user|]Another question"
        "\n[|assistant|]"
    ),
    "falcon3": (
        "<|system|>\nYou are a helpful assistant"
        "\n<|user|>\nHello"
        "\n<|assistant|>\nHi there"
        "\n<|user|>\nWho are you"
        "\n<|assistant|>\n   I am an assistant   "
        "\n<|user|>\nAnother question"
        "\n<|assistant|>\n"
    ),
    "gemma": (
        "<start_of_turn>user\nYou are a helpful assistant"
        "\n\nHello"
        "<end_of_turn>\n<start_of_turn>model\nHi there"
        "<end_of_turn>\n<start_of_turn>user\nWho are you"
        "<end_of_turn>\n<start_of_turn>model\nI am an assistant"
        "<end_of_turn>\n<start_of_turn>user\nAnother question"
        "<end_of_turn>\n<start_of_turn>model\n"
    ),
    "gigachat": (
        "<s>You are a helpful assistant"
        "<|message_sep|>user<|role_sep|>Hello"
        "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
        "assistant<|role_sep|>Hi there"
        "<|message_sep|>user<|role_sep|>Who are you"
        "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
        "assistant<|role_sep|>   I am an assistant   "
        "<|message_sep|>user<|role_sep|>Another question"
        "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
        "assistant<|role_sep|>"
    ),
    "glmedge": (
        "<|system|>\nYou are a helpful assistant"
        "<|user|>\nHello"
        "<|assistant|>\nHi there"
        "<|user|>\nWho are you"
        "<|assistant|>\n   I am an assistant   "
        "<|user|>\nAnother question"
        "<|assistant|>"
    ),
    "gpt-oss": (
        "<|start|>system<|message|>You are a helpful assistant"
        "<|end|><|start|>user<|message|>Hello"
        "<|end|><|start|>assistant<|message|>Hi there"
        "<|return|><|start|>user<|message|>Who are you"
        "<|end|><|start|>assistant<|message|>   I am an assistant   "
        "<|return|><|start|>user<|message|>Another question"
        "<|end|><|start|>assistant"
    ),
    "granite": (
        "<|start_of_role|>system<|end_of_role|>You are a helpful assistant"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   "
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
    ),
    "granite-4.0": (
        "<|start_of_role|>system<|end_of_role|>You are a helpful assistant"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   "
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
    ),
    "granite-4.1": (
        "<|start_of_role|>system<|end_of_role|>You are a helpful assistant"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there"
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   "
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question"
        "<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
    ),
    "grok-2": (
        "System: You are a helpful assistant"
        "<|separator|>\n\nHuman: Hello"
        "<|separator|>\n\nAssistant: Hi there"
        "<|separator|>\n\nHuman: Who are you"
        "<|separator|>\n\nAssistant:    I am an assistant   "
        "<|separator|>\n\nHuman: Another question"
        "<|separator|>\n\nAssistant:"
    ),
    "hunyuan-dense": (
        "You are a helpful assistant"
        "<｜hy_place▁holder▁no▁3｜><｜hy_User｜>Hello"
        "<｜hy_Assistant｜><｜hy_Assistant｜>Hi there"
        "<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Who are you"
        "<｜hy_Assistant｜><｜hy_Assistant｜>   I am an assistant   "
        "<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Another question"
        "<｜hy_Assistant｜>"
    ),
    "hunyuan-moe": (
        "<|startoftext|>You are a helpful assistant"
        "<|extra_4|><|startoftext|>Hello"
        "<|extra_0|>Hi there"
        "<|eos|><|startoftext|>Who are you"
        "<|extra_0|>   I am an assistant   "
        "<|eos|><|startoftext|>Another question"
        "<|extra_0|>"
    ),
    "hunyuan-vl": (
        "<｜hy_begin▁of▁sentence｜>You are a helpful assistant"
        "<｜hy_place▁holder▁no▁3｜>Hello"
        "<｜hy_User｜>Hi there"
        "<｜hy_Assistant｜>Who are you"
        "<｜hy_User｜>   I am an assistant   "
        "<｜hy_Assistant｜>Another question"
        "<｜hy_User｜>"
    ),
    "kimi-k2": (
        "<|im_system|>system<|im_middle|>You are a helpful assistant"
        "<|im_end|><|im_user|>user<|im_middle|>Hello"
        "<|im_end|><|im_assistant|>assistant<|im_middle|>Hi there"
        "<|im_end|><|im_user|>user<|im_middle|>Who are you"
        "<|im_end|><|im_assistant|>assistant<|im_middle|>   I am an assistant   "
        "<|im_end|><|im_user|>user<|im_middle|>Another question"
        "<|im_end|><|im_assistant|>assistant<|im_middle|>"
    ),
    "llama2": (
        "[INST] You are a helpful assistant"
        "\nHello"
        " [/INST]Hi there"
        "</s>[INST] Who are you"
        " [/INST]   I am an assistant   "
        "</s>[INST] Another question"
        " [/INST]"
    ),
    "llama2-sys": (
        "[INST] <<SYS>>\nYou are a helpful assistant"
        "\n<</SYS>>\n\nHello"
        " [/INST]Hi there"
        "</s>[INST] Who are you"
        " [/INST]   I am an assistant   "
        "</s>[INST] Another question"
        " [/INST]"
    ),
    "llama2-sys-bos": (
        "[INST] <<SYS>>\nYou are a helpful assistant"
        "\n<</SYS>>\n\nHello"
        " [/INST]Hi there"
        "</s><s>[INST] Who are you"
        " [/INST]   I am an assistant   "
        "</s><s>[INST] Another question"
        " [/INST]"
    ),
    "llama2-sys-strip": (
        "[INST] <<SYS>>\nYou are a helpful assistant"
        "\n<</SYS>>\n\nHello"
        " [/INST]Hi there"
        "</s>[INST] Who are you"
        " [/INST]I am an assistant"
        "</s>[INST] Another question"
        " [/INST]"
    ),
    "llama3": (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "llama4": (
        "<|header_start|>system<|header_end|>\n\nYou are a helpful assistant"
        "<|eot|><|header_start|>user<|header_end|>\n\nHello"
        "<|eot|><|header_start|>assistant<|header_end|>\n\nHi there"
        "<|eot|><|header_start|>user<|header_end|>\n\nWho are you"
        "<|eot|><|header_start|>assistant<|header_end|>\n\nI am an assistant"
        "<|eot|><|header_start|>user<|header_end|>\n\nAnother question"
        "<|eot|><|header_start|>assistant<|header_end|>\n\n"
    ),
    "megrez": (
        "<|role_start|>system<|role_end|>You are a helpful assistant"
        "<|turn_end|><|role_start|>user<|role_end|>Hello"
        "<|turn_end|><|role_start|>assistant<|role_end|>Hi there"
        "<|turn_end|><|role_start|>user<|role_end|>Who are you"
        "<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   "
        "<|turn_end|><|role_start|>user<|role_end|>Another question"
        "<|turn_end|><|role_start|>assistant<|role_end|>"
    ),
    "minicpm": (
        "You are a helpful assistant"
        "<用户>Hello"
        "<AI>Hi there"
        "<用户>Who are you"
        "<AI>I am an assistant"
        "<用户>Another question"
        "<AI>"
    ),
    "mistral-v1": (
        " [INST] You are a helpful assistant"
        "\n\nHello"
        " [/INST] Hi there"
        "</s> [INST] Who are you"
        " [/INST]    I am an assistant   "
        "</s> [INST] Another question"
        " [/INST]"
    ),
    "mistral-v3": (
        "[INST] You are a helpful assistant"
        "\n\nHello"
        "[/INST] Hi there"
        "</s>[INST] Who are you"
        "[/INST] I am an assistant"
        "</s>[INST] Another question"
        "[/INST]"
    ),
    "mistral-v3-tekken": (
        "[INST]You are a helpful assistant"
        "\n\nHello"
        "[/INST]Hi there"
        "</s>[INST]Who are you"
        "[/INST]   I am an assistant   "
        "</s>[INST]Another question"
        "[/INST]"
    ),
    "mistral-v7": (
        "[SYSTEM_PROMPT] You are a helpful assistant"
        "[/SYSTEM_PROMPT][INST] Hello"
        "[/INST] Hi there"
        "</s>[INST] Who are you"
        "[/INST]    I am an assistant   "
        "</s>[INST] Another question"
        "[/INST]"
    ),
    "mistral-v7-tekken": (
        "[SYSTEM_PROMPT]You are a helpful assistant"
        "[/SYSTEM_PROMPT][INST]Hello"
        "[/INST]Hi there"
        "</s>[INST]Who are you"
        "[/INST]   I am an assistant   "
        "</s>[INST]Another question"
        "[/INST]"
    ),
    "monarch": (
        "system\nYou are a helpful assistant"
        "</s>\n<s>user\nHello"
        "</s>\n<s>assistant\nHi there"
        "</s>\n<s>user\nWho are you"
        "</s>\n<s>assistant\n   I am an assistant   "
        "</s>\n<s>user\nAnother question"
        "</s>\n<s>assistant\n"
    ),
    "openchat": (
        "You are a helpful assistant"
        "<|end_of_turn|>GPT4 Correct User: Hello"
        "<|end_of_turn|>GPT4 Correct Assistant: Hi there"
        "<|end_of_turn|>GPT4 Correct User: Who are you"
        "<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   "
        "<|end_of_turn|>GPT4 Correct User: Another question"
        "<|end_of_turn|>GPT4 Correct Assistant:"
    ),
    "orion": (
        "Human: You are a helpful assistant"
        "\n\nHello"
        "\n\nAssistant: </s>Hi there"
        "</s>Human: Who are you"
        "\n\nAssistant: </s>   I am an assistant   "
        "</s>Human: Another question"
        "\n\nAssistant: </s>"
    ),
    "pangu-embedded": (
        "[unused9]系统：You are a helpful assistant"
        "[unused10][unused9]用户：Hello"
        "[unused10][unused9]助手：Hi there"
        "[unused10][unused9]用户：Who are you"
        "[unused10][unused9]助手：   I am an assistant   "
        "[unused10][unused9]用户：Another question"
        "[unused10][unused9]助手："
    ),
    "phi3": (
        "<|system|>\nYou are a helpful assistant"
        "<|end|>\n<|user|>\nHello"
        "<|end|>\n<|assistant|>\nHi there"
        "<|end|>\n<|user|>\nWho are you"
        "<|end|>\n<|assistant|>\n   I am an assistant   "
        "<|end|>\n<|user|>\nAnother question"
        "<|end|>\n<|assistant|>\n"
    ),
    "phi4": (
        "<|im_start|>system<|im_sep|>You are a helpful assistant"
        "<|im_end|><|im_start|>user<|im_sep|>Hello"
        "<|im_end|><|im_start|>assistant<|im_sep|>Hi there"
        "<|im_end|><|im_start|>user<|im_sep|>Who are you"
        "<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   "
        "<|im_end|><|im_start|>user<|im_sep|>Another question"
        "<|im_end|><|im_start|>assistant<|im_sep|>"
    ),
    "rwkv-world": (
        "System: You are a helpful assistant"
        "\n\nUser: Hello"
        "\n\nAssistant: Hi there"
        "\n\nUser: Who are you"
        "\n\nAssistant: I am an assistant"
        "\n\nUser: Another question"
        "\n\nAssistant:"
    ),
    "seed_oss": (
        "<seed:bos>system\nYou are a helpful assistant"
        "<seed:eos><seed:bos>user\nHello"
        "<seed:eos><seed:bos>assistant\nHi there"
        "<seed:eos><seed:bos>user\nWho are you"
        "<seed:eos><seed:bos>assistant\nI am an assistant"
        "<seed:eos><seed:bos>user\nAnother question"
        "<seed:eos><seed:bos>assistant\n"
    ),
    "smolvlm": (
        "<|im_start|>You are a helpful assistant"
        "\n\nUser: Hello"
        "<end_of_utterance>\nAssistant: Hi there"
        "<end_of_utterance>\nUser: Who are you"
        "<end_of_utterance>\nAssistant:    I am an assistant   "
        "<end_of_utterance>\nUser: Another question"
        "<end_of_utterance>\nAssistant:"
    ),
    "solar-open": (
        "<|begin|>system<|content|>You are a helpful assistant"
        "<|end|><|begin|>user<|content|>Hello"
        "<|end|><|begin|>assistant<|content|>Hi there"
        "<|end|><|begin|>user<|content|>Who are you"
        "<|end|><|begin|>assistant<|content|>   I am an assistant   "
        "<|end|><|begin|>user<|content|>Another question"
        "<|end|><|begin|>assistant"
    ),
    "vicuna": (
        "You are a helpful assistant"
        "\n\nUSER: Hello"
        "\nASSISTANT: Hi there"
        "</s>\nUSER: Who are you"
        "\nASSISTANT:    I am an assistant   "
        "</s>\nUSER: Another question"
        "\nASSISTANT:"
    ),
    "vicuna-orca": (
        "SYSTEM: You are a helpful assistant"
        "\nUSER: Hello"
        "\nASSISTANT: Hi there"
        "</s>\nUSER: Who are you"
        "\nASSISTANT:    I am an assistant   "
        "</s>\nUSER: Another question"
        "\nASSISTANT:"
    ),
    "yandex": (
        " Пользователь: Hello"
        "\n\n Ассистент: Hi there"
        "\n\n Пользователь: Who are you"
        "\n\n Ассистент:    I am an assistant   "
        "\n\n Пользователь: Another question"
        "\n\n Ассистент:[SEP]"
    ),
    "zephyr": (
        "<|system|>\nYou are a helpful assistant"
        "<|endoftext|>\n<|user|>\nHello"
        "<|endoftext|>\n<|assistant|>\nHi there"
        "<|endoftext|>\n<|user|>\nWho are you"
        "<|endoftext|>\n<|assistant|>\n   I am an assistant   "
        "<|endoftext|>\n<|user|>\nAnother question"
        "<|endoftext|>\n<|assistant|>\n"
    ),
}


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
