"""Which built-in template a Jinja chat template looks like (llama.cpp's
`llm_chat_detect_template`): used with `--no-jinja`, where only the built-in ones are rendered."""

from __future__ import annotations

from collections.abc import Callable

from api.chat.builtin.sources import BUILTIN_TEMPLATES


def _mistral_or_llama2(has: Callable[..., bool]) -> str:
    if has("[SYSTEM_PROMPT]"):
        return "mistral-v7"
    if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
        if has(" [INST]"):
            return "mistral-v1"
        if has('"[INST]"'):
            return "mistral-v3-tekken"
        return "mistral-v3"
    if has("content.strip()"):
        return "llama2-sys-strip"
    if has("bos_token + '[INST]"):
        return "llama2-sys-bos"
    if has("<<SYS>>"):
        return "llama2-sys"
    return "llama2"


# (all of these substrings, the template's name), tried in llama.cpp's order
_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|assistant|>", "<|end|>"), "phi3"),
    (("[gMASK]<sop>",), "chatglm4"),
    (("<|assistant|>", "<|user|>", "<|tool_declare|>"), "exaone-moe"),
    (("<|assistant|>", "<|user|>", "</s>"), "falcon3"),
    (("<|assistant|>", "<|user|>"), "glmedge"),
    (("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (("<|user|>", "<|endoftext|>"), "zephyr"),
    (("bos_token + message['role']",), "monarch"),
    (("<start_of_turn>",), "gemma"),
    (("'\\n\\nAssistant: ' + eos_token",), "orion"),
    (("GPT4 Correct ",), "openchat"),
    (("USER: ", "ASSISTANT: ", "SYSTEM: "), "vicuna-orca"),
    (("USER: ", "ASSISTANT: "), "vicuna"),
    (("### Instruction:", "<|EOT|>"), "deepseek"),
    (("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (("[gMASK]sop",), "chatglm3"),
    (("<用户>",), "minicpm"),
    (("'Assistant: ' + message['content'] + eos_token",), "deepseek2"),
    (("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
    (("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"), "exaone4"),
    (("[|system|]", "[|assistant|]", "[|endofturn|]"), "exaone3"),
    (("rwkv-world",), "rwkv-world"),
    (("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}",), "rwkv-world"),
    (("<|start_of_role|>", "<tool_call>", "g4_default_system_message"), "granite-4.0"),
    (("<|start_of_role|>", "<tools>", "g4_default_system_message"), "granite-4.0"),
    (("<|start_of_role|>", "<tool_call>"), "granite-4.1"),
    (("<|start_of_role|>", "<tools>"), "granite-4.1"),
    (("<|start_of_role|>",), "granite"),
    (("message['role'] + additional_special_tokens[0] + message['content'] + "
      "additional_special_tokens[1]",), "gigachat"),
    (("<|role_start|>",), "megrez"),
    ((" Ассистент:",), "yandex"),
    (("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (("<|header_start|>", "<|header_end|>"), "llama4"),
    (("<|endofuserprompt|>",), ""),  # dots.llm1: llama.cpp has no name for it
    (("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (("<|start|>", "<|channel|>"), "gpt-oss"),
    (("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (("<|im_assistant|>assistant<|im_middle|>",), "kimi-k2"),
    (("<seed:bos>",), "seed_oss"),
    (("'Assistant: '  + message['content'] + '<|separator|>",), "grok-2"),
    (("[unused9]系统：[unused10]",), "pangu-embedded"),
    (("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
)


def detect_builtin_template(source: str) -> str | None:
    """The name of the built-in template `source` is (or looks like), or None."""
    if source in BUILTIN_TEMPLATES:
        return source

    def has(*needles: str) -> bool:
        return all(needle in source for needle in needles)

    if has("<|im_start|>"):
        if has("<|im_sep|>"):
            return "phi4"
        return "smolvlm" if has("<end_of_utterance>") else "chatml"
    if source.startswith("mistral") or has("[INST]"):
        return _mistral_or_llama2(has)
    for needles, name in _MARKERS:
        if has(*needles):
            return name or None
    return None
