"""The analyser's per-template corrections (llama.cpp's `workarounds` in
common/chat-diff-analyzer.cpp): templates whose renders hide or distort their models' syntax."""

from __future__ import annotations

from api.chat.autoparse.diff import trim
from api.chat.autoparse.model import Analysis


def apply_workarounds(src: str, a: Analysis) -> None:
    t = a.tools
    if "content.split('</think>')" in src and "reasoning_content" not in src and \
            "<SPECIAL_12>" not in src and a.reasoning.mode == "NONE":
        # old Qwen / DeepSeek thinking templates: no reasoning in the history, still thinking
        a.reasoning.mode, a.reasoning.start, a.reasoning.end = "TAG_BASED", "<think>", "</think>"
    if "Write your thoughts between <think></think> and write your response between " \
            "<response></response>" in src:  # Granite 3.3
        a.reasoning.mode, a.reasoning.start, a.reasoning.end = "TAG_BASED", "<think>", "</think>"
        a.content.mode = "WRAPPED_WITH_REASONING"
        a.content.start, a.content.end = "<response>", "</response>"
    if "<|CHATBOT_TOKEN|>" in src and "<|END_OF_TURN_TOKEN|>" in src and not a.content.start:
        a.content.mode = "ALWAYS_WRAPPED"  # Command R+
        a.content.start, a.content.end = "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
        a.user_start = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
    if 'set has_code_interpreter = tools | selectattr("type", "equalto", ' \
            '"code_interpreter") | list | length > 0' in src:  # Functionary 3.1
        a.content.mode, a.content.end = "PLAIN", ""
        t.name_prefix = t.section_start = t.section_end = t.close = ""
        t.per_call_start, t.per_call_end = "<function=", "</function>"
    if "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + " \
            "'<｜tool▁sep｜>'" in src:  # DeepSeek-R1-Distill-Qwen
        t.section_start, t.section_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
        t.per_call_start, t.per_call_end = "<｜tool▁call▁begin｜>function", "<｜tool▁call▁end｜>"
        t.name_prefix, t.close = "<｜tool▁sep｜>", "```"
    if all(s in src for s in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>",
                              "<TOOL_RESPONSE>")):  # Nemotron Nano v2
        t.mode, t.section_start, t.section_end = "JSON_NATIVE", "", ""
        t.per_call_start, t.per_call_end = "<TOOLCALL>", "</TOOLCALL>"
        t.tools_array_wrapped = True
        a.content.mode, a.content.start, a.content.end = "PLAIN", "", ""
        a.reasoning.mode, a.reasoning.start, a.reasoning.end = "TAG_BASED", "<think>\n", "</think>"
        a.assistant_start, a.user_start = "<SPECIAL_11>Assistant", "<SPECIAL_11>User"
    if "{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n' " \
            "+ message['content'] | trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}" in src:
        a.assistant_start = "<|start_header_id|>assistant<|end_header_id|>"  # Fireworks
        a.user_start = "<|start_header_id|>user<|end_header_id|>"
    if "<|begin|>assistant<|think|><|end|>" in src:  # Solar Open
        a.assistant_start = "<|begin|>assistant"
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in src:  # Apriel 1.6
        a.user_start, a.assistant_start = "<|begin_user|>", "<|begin_assistant|>"
    if 'Respond in the format {"name": function name' in src and "Do not use variables." in src:
        t.openai_wrapper_trigger = True
    if "laguna_glm_thinking" in src:  # Laguna: formatting whitespace the model does not write
        a.reasoning.start, a.reasoning.end = trim(a.reasoning.start), trim(a.reasoning.end)
        t.arg_value_prefix, t.arg_value_suffix = trim(t.arg_value_prefix), trim(t.arg_value_suffix)
        t.arg_separator = trim(t.arg_separator)
        t.tolerate_intertag_whitespace = True
    if "Bailing V3 chat template" in src:
        t.arg_value_suffix = trim(t.arg_value_suffix)
        t.tolerate_intertag_whitespace = True
