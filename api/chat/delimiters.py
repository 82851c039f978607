"""A chat template's message delimiters: the text that starts a user message and the text
that starts an assistant message in what it renders (llama-server's `message_delimiters`).
The worker finds them in the prompt's tokens and cuts and checkpoints the prefill at user
messages (worker/engine/message_spans.py), as llama-server does.

They come from llama.cpp's differential template analysis (common/chat-diff-analyzer.cpp
`detect_user_start_marker`, `detect_assistant_start_marker`, with its per-template
workarounds): render the template with and without a message, and keep the markup that the
message added before its text. A port, not a library: this analysis exists only in llama.cpp.
llama-server makes none for the templates it parses with a dedicated parser
(`common_chat_try_specialized_template`), without --jinja, or with --skip-chat-parsing.
"""

from __future__ import annotations

import functools
from typing import Any

from api.chat.autoparse.diff import Kind, diff_split, segmentize
from api.chat.reasoning_tags import reasoning_tags
from api.chat.templates import ChatTemplate
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.message_delimiters import MessageDelimiter

USER_MSG = "U_USER_MSG Hello END_U"
USER_MSG_TWO = "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
_SPACE = " \t\n\v\f\r"  # C's isspace
_TOOL = {"type": "function", "function": {"name": "foo", "description": "Test function foo",
                                          "parameters": {"type": "object", "properties": {}}}}


def chat_delimiters(settings: ApiSettings, template: ChatTemplate) -> list[MessageDelimiter]:
    """The delimiters a chat job carries under these settings ([] where llama-server has
    none)."""
    if not settings.jinja or settings.skip_chat_parsing or _specialized(template.source):
        return []
    return list(_delimiters(template.source, template.bos_token, template.eos_token))


@functools.lru_cache(maxsize=32)
def _delimiters(source: str, bos_token: str, eos_token: str) -> tuple[MessageDelimiter, ...]:
    """Assistant first, then user, as common_chat_templates_apply_jinja adds them; an empty
    one is left out."""
    template = ChatTemplate("analysis", source, bos_token=bos_token, eos_token=eos_token)
    assistant, user = _overrides(source, _assistant_start(template), _user_start(template))
    return tuple(MessageDelimiter(role=role, delimiter=text)
                 for role, text in (("assistant", assistant), ("user", user)) if text)


# --- the markers -----------------------------------------------------------------------------
def _user_start(template: ChatTemplate) -> str:
    user = {"role": "user", "content": USER_MSG}
    added = _added(template, [], [user])
    if added is None:  # a template that cannot render no messages
        earlier = [{"role": "user", "content": USER_MSG_TWO},
                   {"role": "assistant", "content": ASSISTANT_MSG}]
        added = _added(template, earlier, [*earlier, user])
        if added is None:
            return ""
    if ASSISTANT_MSG in added:
        added = added[added.find(ASSISTANT_MSG) + len(ASSISTANT_MSG):]
    kept, seen_marker = "", False
    for segment in segmentize(_before(added, USER_MSG)):
        if not seen_marker:
            lower = segment.value.lower()
            marker = segment.kind is Kind.MARKER
            if marker and ("end" in lower or "close" in lower):
                continue  # the end of what came before
            if not marker and not _trim(segment.value):
                continue
        seen_marker |= segment.kind is Kind.MARKER
        kept += segment.value
    return _trim(kept)


def _assistant_start(template: ChatTemplate) -> str:
    user = {"role": "user", "content": USER_MSG}
    added = _added(template, [user], [user, {"role": "assistant", "content": ASSISTANT_MSG}])
    if added is None:
        return ""
    prefix = _before(added, ASSISTANT_MSG)
    for tag in reasoning_tags(template.source):
        tag = _trim(tag)
        if tag and tag in prefix:
            prefix = prefix[:prefix.find(tag)]
    return _trim(prefix)


def _overrides(source: str, assistant: str, user: str) -> tuple[str, str]:
    """The analysis's workarounds that set the markers for one template family."""
    if ("<|CHATBOT_TOKEN|>" in source and "<|END_OF_TURN_TOKEN|>" in source
            and "<|START_RESPONSE|>" not in source):  # Command R+ (its content is unwrapped)
        user = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
    if all(t in source for t in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>",
                                  "<TOOL_RESPONSE>")):  # Nemotron Nano v2
        assistant, user = "<SPECIAL_11>Assistant", "<SPECIAL_11>User"
    if ("{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n'"
            " + message['content'] | trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}"
            in source):  # Fireworks v2
        assistant = "<|start_header_id|>assistant<|end_header_id|>"
        user = "<|start_header_id|>user<|end_header_id|>"
    if "<|begin|>assistant<|think|><|end|>" in source:  # Solar Open
        assistant = "<|begin|>assistant"
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in source:  # Apriel 1.6
        assistant, user = "<|begin_assistant|>", "<|begin_user|>"
    return assistant, user


def _specialized(source: str) -> bool:
    """Whether llama.cpp parses this template's output with a dedicated parser
    (common_chat_try_specialized_template), which sets no delimiters."""
    def has(*texts: str) -> bool:
        return all(t in source for t in texts)

    return (
        (has("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]") and "[CALL_ID]" not in source)
        or has("<|channel|>")
        or has("<atem:function_calls>", "<|eom|>")
        or has(">>>all", ">>>${recipient}")
        or has("<|tool_calls_section_begin|>", "<|tool_call_begin|>")
        or has("<|open|>", "<|close|>", "<|end_of_msg|>")
        or has("<role>ASSISTANT</role>", "<arg_key>")
        or has("<|START_TEXT|>", "<|START_ACTION|>")
        or has("<|tool_list_start|>", "<|tool_list_end|>")
        or (has("List of tools: [") and "<|tool_list_start|>" not in source)
        or (has("<|role_sep|>", "<|message_sep|>") and "<|function_call|>" not in source)
        or has("]<]minimax[>[", "<tool_call>", "<invoke name=")
        or (has("dsml_token", "DSML") and ("function_calls" in source or "tool_calls" in source))
        or has("'<|tool_call>call:'")
        or has("Tool usage guidelines:", '<function name="', '<param name="')
        or (has("<tool_call>", "<function=", "<parameter=")
            and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in source))


# --- rendering and the diff ------------------------------------------------------------------
def _added(template: ChatTemplate, before: list[dict[str, Any]],
           after: list[dict[str, Any]]) -> str | None:
    """What rendering `after` adds to rendering `before` (the right side of their diff), None
    when either fails to render."""
    for tools in (None, [_TOOL]):  # tool-use templates that iterate `tools` unguarded
        try:
            # `tools` null rather than undefined: a template that iterates it unguarded fails
            # and is rendered with a tool instead, as llama-server's analysis renders it
            left, right = (template.render(m, tools=tools, add_generation_prompt=False,
                                           allow_empty=True, continue_final_message=False,
                                           extra_context={"enable_thinking": True,
                                                          "tools": None})
                           for m in (before, after))
            return diff_split(left, right).right  # calculate_diff_split's `right`
        except InvalidRequest:
            continue
    return None


def _before(text: str, needle: str) -> str:
    """`text` up to `needle` (all of it when `needle` is not in it)."""
    at = text.find(needle)
    return text if at < 0 else text[:at]


def _trim(text: str) -> str:
    return text.strip(_SPACE)
