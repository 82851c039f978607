"""A template llama.cpp's auto-parser reads (Solar Open: a tagged name, JSON arguments), end to
end: `tool_choice: "required"` with two tools forces the call in the template's own markers,
one grammar alternative per function (worker/engine/framed_grammar.py), and the call streams
as llama-server streams it: the id and name first, then the arguments in pieces
(api/chat/autoparse/streamed.py). A tiny GGUF with Solar Open's real template; an api pod that
skips chat parsing shows the raw text the grammar forced."""

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

TOOLS: Any = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "special_function", "description": "Anything special",
        "parameters": {"type": "object", "properties": {"arg1": {"enum": [1, 2]}},
                       "required": ["arg1"]}}},
]
OPEN = "<|tool_calls|><|tool_call:begin|>call00001<|tool_call:name|>"
CLOSE = "<|tool_call:end|><|calls|>"


@pytest.fixture(scope="module")
def apis(redis_url: str, workdir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    yield from parsed_and_raw_apis(redis_url, workdir, tmp_path_factory.mktemp("solar"),
                                   "upstage-Solar-Open-100B.jinja", "tiny-solar")


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny-solar", "messages": [{"role": "user", "content": "Weather?"}],
            "tools": TOOLS, "tool_choice": "required", "max_tokens": 200, "temperature": 0.0,
            **extra}


def ask(api: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(api + "/v1/chat/completions", json=_body(**extra), timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json()["choices"][0])


def test_required_with_two_tools_writes_either_in_the_templates_markers(
        apis: tuple[str, str]) -> None:
    """Sampled under six seeds, the model calls each function in the template's markers (the
    grammar offers both), and the call comes back as that function's `tool_calls`."""
    parsed, raw = apis
    named = set()
    for seed in range(1, 7):
        text = ask(raw, temperature=1.0, seed=seed)["message"]["content"]
        name = text.removeprefix(OPEN).partition("<|tool_call:args|>")[0]
        assert text.startswith(OPEN) and text.endswith(CLOSE), text
        assert name in ("get_weather", "special_function"), text
        choice = ask(parsed, temperature=1.0, seed=seed)
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == name
        arguments = json.loads(call["function"]["arguments"])
        assert arguments in ({"city": "Paris"}, {"city": "Rome"}, {"arg1": 1}, {"arg1": 2})
        assert set(arguments) == ({"city"} if name == "get_weather" else {"arg1"})
        named.add(name)
    assert named == {"get_weather", "special_function"}


def test_the_call_streams_its_arguments_in_pieces(apis: tuple[str, str]) -> None:
    parsed, _ = apis
    whole = ask(parsed)["message"]["tool_calls"][0]
    chunks = [c for c in sse_payloads(parsed, "/v1/chat/completions", _body())
              if isinstance(c, dict) and c["choices"]]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    head, *pieces = calls
    assert head["function"]["name"] == whole["function"]["name"] and head["id"]
    assert head["index"] == 0 and head["function"].get("arguments", "") == ""
    assert len(pieces) > 1 and all("name" not in p.get("function", {}) for p in pieces)
    assert "".join(p["function"]["arguments"] for p in pieces) == whole["function"]["arguments"]
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
