"""llama.cpp's auto-parser analysis, ported (its tests/test-chat-auto-parser.cpp): the marker-aware
diff of two renders, and what the analysis of each template finds (reasoning tags, content
wrappers, tool-call syntax, role markers) equal to what the vendored llama.cpp finds."""

from __future__ import annotations

import dataclasses
import json

import pytest

from api.chat.autoparse.analysis import analyze
from api.chat.autoparse.diff import (
    Kind,
    after_common_suffix,
    diff_split,
    segmentize,
    until_common_prefix,
)
from api.chat.autoparse.model import Analysis
from tests.paths import DATA

TEMPLATES = DATA / "templates"
DIFF_CASES = json.loads((DATA / "autoparser_diff_cases.json").read_text("utf-8"))["diff_split"]


def _analysis(name: str) -> Analysis:
    return analyze((TEMPLATES / f"{name}.jinja").read_text("utf-8"))


@pytest.mark.parametrize(("text", "expected"), [
    ("pre_marker[marker]post_marker", [("T", "pre_marker"), ("M", "[marker]"),
                                       ("T", "post_marker")]),
    ("pre_marker<marker>post_marker", [("T", "pre_marker"), ("M", "<marker>"),
                                       ("T", "post_marker")]),
    ("<hello>world</hello>", [("M", "<hello>"), ("T", "world"), ("M", "</hello>")]),
    ("<hello>[hello]<world>[world]", [("M", "<hello>"), ("M", "[hello]"), ("M", "<world>"),
                                      ("M", "[world]")]),
    ("im<blue>daba<dee>da[hey]", [("T", "im"), ("M", "<blue>"), ("T", "daba"), ("M", "<dee>"),
                                  ("T", "da"), ("M", "[hey]")]),
])
def test_segments(text: str, expected: list[tuple[str, str]]) -> None:
    got = [("M" if s.kind is Kind.MARKER else "T", s.value) for s in segmentize(text)]
    assert got == expected


@pytest.mark.parametrize(("left", "right", "prefix", "left_part", "right_part", "suffix"),
                         DIFF_CASES)
def test_diff_split(left: str, right: str, prefix: str, left_part: str, right_part: str,
                    suffix: str) -> None:
    got = diff_split(left, right)
    assert (got.prefix, got.left, got.right, got.suffix) == (prefix, left_part, right_part,
                                                             suffix)


def test_diff_cases_loaded() -> None:
    assert len(DIFF_CASES) >= 35


@pytest.mark.parametrize(("full", "left", "right", "expected"), [
    ("<function name=foo><arg name=bar>", "<arg name=bar>", "<arg name=baz>",
     "<function name=foo>"),
    ("prefix<test>suffix", "<test>different", "<test>other", "prefix"),
    ("<common>rest", "<common>left", "<common>right", ""),
    ("something", "left", "right", ""),
    ("test", "", "right", ""),
    ("abcXYZ<shared_prefix>rest", "<shared_prefix>left", "<shared_prefix>right", "abcXYZ"),
])
def test_until_common_prefix(full: str, left: str, right: str, expected: str) -> None:
    assert until_common_prefix(full, left, right) == expected


@pytest.mark.parametrize(("full", "left", "right", "expected"), [
    ("<function name=foo><arg name=bar>100</arg></function>", "<arg name=bar>100</arg>",
     "<arg name=baz>535</arg>", "</function>"),
    ("rest<common>", "left<common>", "right<common>", ""),
    ("test", "left", "", ""),
    ("<outer><inner>value</inner></outer>", "<inner>value</inner>", "<inner>different</inner>",
     "</outer>"),
])
def test_after_common_suffix(full: str, left: str, right: str, expected: str) -> None:
    assert after_common_suffix(full, left, right) == expected


def test_nemotron_3_nano() -> None:
    a = _analysis("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert (a.reasoning.mode, a.reasoning.start, a.reasoning.end) == \
        ("TAG_BASED", "<think>\n", "\n</think>\n")
    assert (a.content.mode, a.content.start, a.content.end) == ("PLAIN", "", "")
    t = a.tools
    assert t.mode == "TAG_WITH_TAGGED"
    assert (t.section_start, t.section_end) == ("", "")
    assert (t.per_call_start, t.per_call_end) == ("<tool_call>\n", "</tool_call>")
    assert (t.name_prefix, t.name_suffix, t.close) == ("<function=", ">\n", "</function>\n")
    assert (t.arg_name_prefix, t.arg_name_suffix, t.arg_value_suffix) == \
        ("<parameter=", ">\n", "\n</parameter>\n")
    assert a.supports_parallel_tool_calls


def test_command_r7b() -> None:
    a = _analysis("CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    assert (a.reasoning.mode, a.reasoning.start, a.reasoning.end) == \
        ("TOOLS_ONLY", "<|START_THINKING|>", "<|END_THINKING|>")
    assert (a.content.mode, a.content.start, a.content.end) == \
        ("ALWAYS_WRAPPED", "<|START_RESPONSE|>", "<|END_RESPONSE|>")
    t = a.tools
    assert t.mode == "JSON_NATIVE"
    assert (t.section_start, t.section_end, t.per_call_start, t.per_call_end) == \
        ("<|START_ACTION|>", "<|END_ACTION|>", "", "")
    assert (t.name_prefix, t.name_suffix, t.close) == ("", "", "")
    assert (t.args_start, t.args_end, t.arg_name_prefix, t.arg_name_suffix,
            t.arg_value_prefix, t.arg_value_suffix, t.arg_separator) == ("",) * 7
    assert (t.name_field, t.args_field, t.id_field) == ("tool_name", "parameters", "")
    assert t.tools_array_wrapped
    assert a.supports_parallel_tool_calls


def test_smollm3() -> None:
    a = _analysis("HuggingFaceTB-SmolLM3-3B")
    assert (a.reasoning.mode, a.reasoning.start, a.reasoning.end) == \
        ("TAG_BASED", "<think>", "</think>")
    assert (a.content.mode, a.content.start, a.content.end) == ("PLAIN", "", "")


@pytest.mark.parametrize("name", ["poolside-Laguna-XS-2.1", "poolside-Laguna-S-2.1",
                                  "poolside-Laguna-XS.2"])
def test_laguna(name: str) -> None:
    a = _analysis(name)
    assert (a.reasoning.mode, a.reasoning.start, a.reasoning.end) == \
        ("TAG_BASED", "<think>", "</think>")
    assert a.tools.arg_value_suffix == "</arg_value>"


BAILING_V3 = """
{# Bailing V3 chat template #}
{%- if tools %}{{ tools | tojson }}{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<role>HUMAN</role>' + message.content + '<|role_end|>' }}
    {%- elif message.role == "assistant" %}
        {{- '<role>ASSISTANT</role>' }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- set tc = tool_call.function %}
                {{- '<tool_call>' + tc.name }}
                {%- for k, v in tc.arguments.items() %}
                    {{- '<arg_key>' + k + '</arg_key>' }}
                    {{- '\\n<arg_value>' + v + '</arg_value>' }}
                {%- endfor %}
                {{- '\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|role_end|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<role>ASSISTANT</role>' }}{%- endif %}
"""


def test_bailing_v3() -> None:
    a = analyze(BAILING_V3)
    assert a.tools.arg_value_suffix == "</arg_value>"
    assert a.tools.tolerate_intertag_whitespace


IM, DS, L3 = "<|im_start|>", "<｜User｜>", "<|start_header_id|>{}<|end_header_id|>"


@pytest.mark.parametrize(("name", "user", "assistant"), [
    ("Bielik-11B-v3.0-Instruct", f"{IM}user", f"{IM}assistant"),
    ("HuggingFaceTB-SmolLM3-3B", f"{IM}user", f"{IM}assistant"),
    ("MiMo-VL", f"{IM}user", f"{IM}assistant"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", f"{IM}user", f"{IM}assistant"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", f"{IM}user", f"{IM}assistant"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", f"{IM}user", f"{IM}assistant"),
    ("Qwen3.5-4B", f"{IM}user", f"{IM}assistant"),
    ("Qwen3-Coder", f"{IM}user", f"{IM}assistant"),
    ("Qwen-Qwen2.5-7B-Instruct", f"{IM}user", f"{IM}assistant"),
    ("Qwen-Qwen3-0.6B", f"{IM}user", f"{IM}assistant"),
    ("Qwen-QwQ-32B", f"{IM}user", f"{IM}assistant"),
    ("StepFun3.5-Flash", f"{IM}user", f"{IM}assistant"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", DS, "<｜Assistant｜>"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", DS, "<｜Assistant｜>"),
    ("deepseek-ai-DeepSeek-V3.1", DS, "<｜Assistant｜>"),
    ("llama-cpp-deepseek-r1", DS, "<｜Assistant｜>"),
    ("meetkai-functionary-medium-v3.1", L3.format("user"), L3.format("assistant")),
    ("meta-llama-Llama-3.1-8B-Instruct", L3.format("user"), L3.format("assistant")),
    ("meta-llama-Llama-3.2-3B-Instruct", L3.format("user"), L3.format("assistant")),
    ("meta-llama-Llama-3.3-70B-Instruct", L3.format("user"), L3.format("assistant")),
    ("fireworks-ai-llama-3-firefunction-v2", L3.format("user"), L3.format("assistant")),
    ("microsoft-Phi-3.5-mini-instruct", "<|user|>", "<|assistant|>"),
    ("GLM-4.6", "<|user|>", "<|assistant|>"),
    ("unsloth-Apriel-1.5", "<|user|>", "<|assistant|>"),
    ("GLM-4.7-Flash", "<|user|>", "<|assistant|>"),
    ("google-gemma-2-2b-it", "<start_of_turn>user", "<start_of_turn>model"),
    ("ibm-granite-granite-3.3-2B-Instruct", "<|start_of_role|>user<|end_of_role|>",
     "<|start_of_role|>assistant<|end_of_role|>"),
    ("ibm-granite-granite-4.0", "<|start_of_role|>user<|end_of_role|>",
     "<|start_of_role|>assistant<|end_of_role|>"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
     "<|START_RESPONSE|>"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "[INST]", ""),
    ("Mistral-Small-3.2-24B-Instruct-2506", "[INST]", ""),
    ("Apertus-8B-Instruct", "<|user_start|>", "<|assistant_start|>"),
    ("Apriel-1.6-15b-Thinker-fixed", "<|begin_user|>", "<|begin_assistant|>"),
    ("ByteDance-Seed-OSS", "<seed:bos>user", "<seed:bos>assistant"),
    ("GigaChat3.1-10B-A1.8B", "user<|role_sep|>", "assistant<|role_sep|>"),
    ("MiniMax-M2", "]~b]user", "]~b]ai"),
    ("tencent-Hy3", "<｜hy_User:opensource｜>", "<｜hy_Assistant:opensource｜>"),
    ("NVIDIA-Nemotron-Nano-v2", "<SPECIAL_11>User", "<SPECIAL_11>Assistant"),
    ("Reka-Edge", "human:", "assistant:"),
    ("llama-cpp-rwkv-world", "User:", "Assistant:"),
    ("upstage-Solar-Open-100B", "<|begin|>user<|content|>", "<|begin|>assistant"),
])
def test_role_markers(name: str, user: str, assistant: str) -> None:
    a = _analysis(name)
    assert (a.user_start, a.assistant_start) == (user, assistant)


LLAMA_CPP_ANALYSES = json.loads((DATA / "llama_cpp_autoparser.json").read_text("utf-8"))
"""The vendored llama.cpp's own analysis of each template (its autoparser, every field),
recorded by bench/malformed_calls.py through bench/chat_oracle."""


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_ANALYSES))
def test_analysis_equals_llama_cpps(name: str) -> None:
    """Every field llama.cpp's analysis finds, ours finds alike: reasoning tags, content
    wrappers, the tool-call syntax down to call-id markers (Mistral Small 3.2's [CALL_ID] …
    [ARGS]) and argument tags, role markers. Before the call-id analysis, renders as llama.cpp
    renders them (arguments as objects) and string + object as llama.cpp's engine adds them,
    Kimi K3, Gemma 4, Functionary v3.2, gpt-oss and Mistral Small 3.2 differed."""
    want = LLAMA_CPP_ANALYSES[name]
    a = analyze((TEMPLATES / name).read_text("utf-8"))
    got = {"reasoning": dataclasses.asdict(a.reasoning), "content": dataclasses.asdict(a.content),
           "tools": dataclasses.asdict(a.tools), "user_start": a.user_start,
           "assistant_start": a.assistant_start}
    want = {key: want[key] for key in got}
    assert got == want
