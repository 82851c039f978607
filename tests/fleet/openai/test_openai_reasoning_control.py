"""Reasoning budget and /v1/chat/completions/control, on a thinking block the prompt opens
(a prefilled `<think>`: the base model used in tests does not think on its own)."""

from __future__ import annotations

import json

import httpx

THINKING = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>"}]


def test_reasoning_budget_ends_the_thinking_block(api: str) -> None:
    body = {"messages": THINKING, "max_tokens": 40, "temperature": 0,
            "reasoning_format": "deepseek", "reasoning_budget_tokens": 4,
            "reasoning_budget_message": " Enough."}
    message = httpx.post(f"{api}/v1/chat/completions", json=body,
                         timeout=120).json()["choices"][0]["message"]
    assert message["reasoning_content"].endswith(" Enough.")
    assert message["content"]


def test_control_ends_reasoning_of_a_running_completion(api: str) -> None:
    body = {"messages": THINKING, "max_tokens": 400, "temperature": 0, "stream": True,
            "reasoning_format": "deepseek", "reasoning_control": True}
    reasoning = content = ""
    chunks_after_ask: int | None = None
    with httpx.stream("POST", f"{api}/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            completion_id = chunk["id"]
            if not chunk["choices"]:
                continue
            delta = chunk["choices"][0]["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            if chunks_after_ask is not None and not content:
                chunks_after_ask += 1
            if chunks_after_ask is None and len(reasoning) > 5:
                asked = httpx.post(f"{api}/v1/chat/completions/control",
                                   json={"id": completion_id, "action": "reasoning_end"})
                assert asked.json() == {"success": True}
                chunks_after_ask = 0
    assert content, "the thinking block never ended"
    assert chunks_after_ask is not None and chunks_after_ask < 10  # ended right after the ask
    finished = httpx.post(f"{api}/v1/chat/completions/control",
                          json={"id": completion_id, "action": "reasoning_end"})
    assert finished.status_code == 200 and finished.json()["success"] is False


def test_control_of_an_unknown_id(api: str) -> None:
    response = httpx.post(f"{api}/v1/chat/completions/control",
                          json={"id": "chatcmpl-nope", "action": "reasoning_end"})
    assert response.status_code == 200 and response.json()["success"] is False
