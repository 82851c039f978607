"""`tool_choice: "required"` forces the call in the template's own format, as llama-server's
format grammar does (not llama.cpp's generic `{"tool_call": …}` JSON with its system-prompt
line): a tiny GGUF with Hermes 3's real template writes `<tool_call>\\n{"name", "arguments"}
\\n</tool_call>` blocks, which come back as `tool_calls` (and, on an api pod that skips chat
parsing, as that raw text)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.openai.template_fleet import parsed_and_raw_apis
from tests.fleet.openai.test_openai_completions import sse_payloads

pytestmark = pytest.mark.process

TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def apis(redis_url: str, workdir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    yield from parsed_and_raw_apis(redis_url, workdir, tmp_path_factory.mktemp("hermes"),
                                   "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                                   "tiny-hermes", n_ctx=16384,
                                   control=("<tool_call>", "</tool_call>"))


def ask(api: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "tiny-hermes", "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [TOOL], "tool_choice": "required", "max_tokens": 300, "temperature": 0.0,
            **extra}
    response = httpx.post(api + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json()["choices"][0])


def test_required_writes_the_templates_own_format(apis: tuple[str, str]) -> None:
    parsed, raw = apis
    first = ask(raw)
    text = first["message"]["content"]
    assert text.startswith("<tool_call>\n{") and text.endswith("\n</tool_call>"), first
    choice = ask(parsed)
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")


def test_the_call_streams_its_arguments_in_pieces(apis: tuple[str, str]) -> None:
    parsed, _ = apis
    whole = ask(parsed)["message"]["tool_calls"][0]
    body = {"model": "tiny-hermes", "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [TOOL], "tool_choice": "required", "max_tokens": 300, "temperature": 0.0,
            "stream": True}
    chunks = [c for c in sse_payloads(parsed, "/v1/chat/completions", body)
              if isinstance(c, dict) and c["choices"]]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    head, *pieces = calls
    assert head["function"]["name"] == "get_weather" and head["id"]
    assert head["function"].get("arguments", "") == ""
    assert len(pieces) > 1 and all("name" not in p.get("function", {}) for p in pieces)
    arguments = "".join(p["function"]["arguments"] for p in pieces)
    assert json.loads(arguments) == json.loads(whole["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
