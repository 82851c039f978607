"""The thinking block's tags and the reasoning formats (llama-server's --reasoning-format):
which tags a template's models write, and whether a rendered prompt already opened the
block."""

from __future__ import annotations

from api.chat.tool_formats import WHITESPACE
from scheduler.contract.errors import InvalidRequest

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")

_REASONING_TAGS = (
    ("<|channel|>", "<|end|>"),  # gpt-oss (harmony): its analysis channel; see below
    ("[THINK]", "[/THINK]"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("<seed:think>", "</seed:think>"),
    ("<mm:think>", "</mm:think>"),  # MiniMax-M3
    ("<|channel>thought", "<channel|>"),  # Gemma 4
    # Apriel 1.6: the reasoning follows the assistant's turn marker, up to its final marker
    ("<|begin_assistant|>", "[BEGIN FINAL RESPONSE]"),
)
KIMI_K3_MARKERS = ("<|open|>", "<|close|>", "<|end_of_msg|>")
"""Kimi K3's markup tokens (its tags are `<|open|>NAME<|sep|>` … `<|close|>NAME<|sep|>`)."""
_HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
_DEFAULT_REASONING_TAGS = ("<think>", "</think>")


def check_reasoning_format(name: str) -> str:
    """The reasoning format, or InvalidRequest in llama.cpp's words."""
    if name not in REASONING_FORMATS:
        raise InvalidRequest(f"Unknown reasoning format: {name}")
    return name


def reasoning_tags(template_source: str = "") -> tuple[str, str]:
    """The (start, end) thinking tags a template's models write (gpt-oss: llama.cpp's
    `<|channel|>analysis<|message|>` … `<|end|>`)."""
    if "<atem:function_calls>" in template_source and "<|eom|>" in template_source:
        return "to=self<|message|>", "<|eom|>"  # Muse Glimmer: its message to itself
    if all(marker in template_source for marker in KIMI_K3_MARKERS):
        return "<|open|>think<|sep|>", "<|close|>think<|sep|>"
    for start, end in _REASONING_TAGS:
        if start in template_source:
            return (_HARMONY_ANALYSIS if start == "<|channel|>" else start), end
    return _DEFAULT_REASONING_TAGS


def prompt_opens_thinking(prompt: str, template_source: str = "") -> bool:
    """Whether a rendered prompt ends inside a think block (DeepSeek-R1, Qwen3 …): the value
    for `ChatOutputParser(thinking_forced_open=...)`."""
    start, end = reasoning_tags(template_source)
    if start == "<|begin_assistant|>":  # Apriel 1.6 opens it with a preamble of its own
        tail = prompt[prompt.rfind(start) + len(start):] if start in prompt else end
        return end not in tail
    return prompt.rstrip(WHITESPACE).endswith(start)
