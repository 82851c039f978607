"""llama.cpp's own chat parser cases (the vendored tests/test-chat.cpp, ported by
bench/port_chat_cases.py): every case llamaq answers as llama.cpp does stays so, whole and
streamed a character at a time (tests/chat_cases.py). The cases it does not yet answer alike are
listed in tests/data/chat_cases_differ.txt; one of them that starts to pass fails here until it
leaves the list (`python -m tests.chat_cases_differ` rewrites it), so the count only goes up."""

from __future__ import annotations

import pytest

from api.chat.chat_formats import detect_chat_format
from tests.chat_cases import TEMPLATES, cases, normal, run, verdict
from tests.paths import DATA

DIFFER = frozenset((DATA / "chat_cases_differ.txt").read_text("utf-8").split())
CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_llama_cpp_chat_case(case) -> None:
    differs = verdict(case)
    if case["id"] in DIFFER:
        assert differs, "answered as llama.cpp does now: take it off chat_cases_differ.txt"
    else:
        assert not differs, differs


def test_the_differ_list_names_only_ported_cases() -> None:
    assert {c["id"] for c in CASES} >= DIFFER


FAMILIES = {
    "Apertus-8B-Instruct": "apertus", "Apriel-1.6-15b-Thinker-fixed": "apriel",
    "ByteDance-Seed-OSS": "seed-oss", "Cohere2MoE": "cohere2moe",
    "CohereForAI-c4ai-command-r-plus-tool_use": "command-r-plus",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": "command-r7b", "GLM-4.6": "glm-4.5",
    "GLM-4.7-Flash": "glm-4.5", "GigaChat3-10B-A1.8B": "gigachat-v3",
    "GigaChat3.1-10B-A1.8B": "gigachat-v3.1", "Kimi-K2-Instruct": "kimi-k2",
    "Kimi-K2-Thinking": "kimi-k2", "Kimi-K3": "kimi-k3", "LFM2-8B-A1B": "lfm2",
    "LFM2.5-8B-A1B": "lfm2", "LFM2.5-Instruct": "lfm2", "MiniMax-M2": "minimax-m2",
    "MiniMax-M3": "minimax-m3", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3-coder",
    "NVIDIA-Nemotron-Nano-v2": "nemotron-v2", "Qwen3-Coder": "qwen3-coder",
    "Qwen3.5-4B": "qwen3-coder", "Spark2.5": "glm-4.5", "StepFun3.5-Flash": "qwen3-coder",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4": "deepseek-v3.2",
    "fireworks-ai-llama-3-firefunction-v2": "firefunction-v2",
    "google-gemma-4-31B-it": "gemma4", "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "inclusionai-ling-3.0-flash": "ling3", "meetkai-functionary-medium-v3.2": "functionary-v3.2",
    "moonshotai-Kimi-K2": "kimi-k2", "muse-glimmer": "muse-glimmer",
    "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "minicpm5", "unsloth-Apriel-1.5": "apriel",
}
"""The family each ported template is recognised as (the others: the generic reader, which
takes Hermes/Qwen `<tool_call>`, Llama 3.x, Mistral, DeepSeek R1/V3.1 and JSON calls)."""


def test_each_template_is_recognised_as_its_family() -> None:
    found = {}
    for name in sorted({c["template"] for c in CASES}):
        source = (TEMPLATES / name).read_text("utf-8")
        family = detect_chat_format(source).name
        if family != "generic":
            found[name.removesuffix(".jinja")] = family
    assert found == FAMILIES


CALL_CASES = list({c["template"]: c for c in reversed(CASES)
                   if c["expect"]["tool_calls"] and not c["params"].get("is_partial")}.values())
"""The first tool-call case of each template."""


@pytest.mark.parametrize("case", CALL_CASES, ids=[c["id"] for c in CALL_CASES])
def test_a_cut_or_broken_call_never_fails_and_streams_as_it_reads_whole(case) -> None:
    """Malformed output (a call cut by max_tokens, arguments that are not JSON) is content or a
    call, never an error, and the stream adds up to the whole answer."""
    text = case["input"]
    broken = text.replace("}", "", 1).replace('"', "'", 2)
    for variant in (text[: len(text) // 3], text[: len(text) // 2], text[:-1], broken):
        outcome = run({**case, "input": variant})
        assert not outcome.error, outcome.error
        assert outcome.whole is not None and outcome.streamed is not None
        whole, streamed = normal(outcome.whole, []), normal(outcome.streamed, [])
        assert streamed == whole, variant
