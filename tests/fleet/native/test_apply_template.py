"""POST /apply-template against a running fleet (Gemma 3 270M: no template in its GGUF → chatml),
and the start of an api with a `--chat-template` name nobody knows."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.processes import free_port

CHAT = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
]
CHATML = ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
          "<|im_start|>user\nHello<|im_end|>\n"
          "<|im_start|>assistant\nHi there<|im_end|>\n"
          "<|im_start|>user\nWho are you<|im_end|>\n"
          "<|im_start|>assistant\n")


def apply(api: str, body: Any) -> httpx.Response:
    return httpx.post(f"{api}/apply-template", json=body, timeout=30)


def test_apply_template_renders_chatml_for_a_model_without_template(api: str) -> None:
    response = apply(api, {"messages": CHAT})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": CHATML}


def test_apply_template_takes_the_chat_request_fields(api: str) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                          {"type": "text", "text": "again"}]}]
    response = apply(api, {"model": "gemma", "messages": parts, "tools": tools,
                           "chat_template_kwargs": {"enable_thinking": False},
                           "reasoning_effort": "low", "temperature": 0.5})
    assert response.status_code == 200, response.text
    assert response.json()["prompt"] == ("<|im_start|>user\nHello\nagain<|im_end|>\n"
                                         "<|im_start|>assistant\n")


def test_apply_template_continues_a_final_assistant_message(api: str) -> None:
    prefill = [*CHAT[:2], {"role": "assistant", "content": "Hi! I am"}]
    response = apply(api, {"messages": prefill})
    assert response.json()["prompt"] == ("<|im_start|>system\nYou are a helpful assistant"
                                         "<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                                         "<|im_start|>assistant\nHi! I am")
    closed = apply(api, {"messages": prefill, "add_generation_prompt": False,
                         "continue_final_message": False})
    assert closed.json()["prompt"].endswith("<|im_start|>assistant\nHi! I am<|im_end|>\n")


@pytest.mark.parametrize("body", [
    {},
    {"messages": "hello"},
    {"messages": []},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": 42}]},
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                  {"role": "assistant", "content": "b"}]},
    {"messages": CHAT, "continue_final_message": True},
    {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": "yes"}},
])
def test_apply_template_bad_requests(api: str, body: dict[str, Any]) -> None:
    response = apply(api, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == 400


def test_apply_template_media_needs_a_projector(api: str) -> None:
    image = {"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": "data:image/png;base64,AA"}}]}
    response = apply(api, {"messages": [image]})
    assert response.status_code == 500, response.text  # as llama-server, without an mmproj
    assert response.json()["error"]["type"] == "server_error"


@pytest.mark.process
def test_unknown_chat_template_stops_the_api() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llamaq", "api", "--port", str(free_port()),
         "--chat-template", "llama-9000"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "LLAMAQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "unknown chat template 'llama-9000'" in output
    for name in ("chatml", "llama3", "gemma", "mistral-v7", "gpt-oss", "zephyr"):
        assert name in output
