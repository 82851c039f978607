"""A chat template's message delimiters (api/chat/delimiters.py) against what the vendored
llama-server's template analysis logs for the same template (`-v`: `assistant_msg_start`,
`user_msg_start`; recorded Dec 3 with `--jinja --chat-template-file`)."""

from __future__ import annotations

import pytest

from api.chat.delimiters import chat_delimiters
from api.chat.templates import ChatTemplate
from api.settings import ApiSettings
from tests.paths import DATA

TEMPLATES = DATA / "templates"
RECORDED = {
    "Qwen-Qwen3-0.6B": ("<|im_start|>assistant", "<|im_start|>user"),
    "google-gemma-2-2b-it": ("<start_of_turn>model", "<start_of_turn>user"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|start_header_id|>assistant<|end_header_id|>",
                                         "<|start_header_id|>user<|end_header_id|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<|end|>\n<|assistant|>", "<|user|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|im_start|>assistant",
                                                    "<|im_start|>user"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("", "[INST]"),
    "CohereForAI-c4ai-command-r-plus-tool_use": (
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("<|START_RESPONSE|>",
                                                      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|start_of_role|>assistant<|end_of_role|>",
                                            "<|start_of_role|>user<|end_of_role|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜Assistant｜>", "<｜User｜>"),
    "openai-gpt-oss-120b": ("", ""),  # a dedicated parser: llama-server sets none
}


def delimiters(name: str, **settings: object) -> tuple[str, str]:
    source = (TEMPLATES / f"{name}.jinja").read_text("utf-8")
    found = chat_delimiters(ApiSettings(**settings),  # type: ignore[arg-type]
                            ChatTemplate(name, source, bos_token="<s>", eos_token="</s>"))
    by_role = {d.role: d.delimiter for d in found}
    assert "" not in by_role.values()
    return by_role.get("assistant", ""), by_role.get("user", "")


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_delimiters_are_llama_servers(name: str) -> None:
    assert delimiters(name) == RECORDED[name]


def test_none_without_jinja_or_with_chat_parsing_skipped() -> None:
    assert delimiters("Qwen-Qwen3-0.6B", jinja=False) == ("", "")
    assert delimiters("Qwen-Qwen3-0.6B", skip_chat_parsing=True) == ("", "")
