"""A template llama.cpp's auto-parser reads whose arguments are tagged pairs (Tencent Hy3:
`<tool_call:opensource>NAME<tool_sep:opensource>` then `<arg_key:opensource>K</arg_key…>`
`<arg_value:opensource>V</arg_value…>` pairs), end to end: `tool_choice: "required"` forces
the call in the template's own markers, each function's pairs as its schema allows
(worker/engine/tagged_grammar.py), and the call comes back as `tool_calls`. A tiny GGUF with
Hy3's real template; an api pod that skips chat parsing shows the raw text the grammar
forced."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.openai.template_fleet import parsed_and_raw_apis

pytestmark = pytest.mark.process

TOOLS: Any = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"days": {"enum": [1, 2]}},
                       "required": ["days"]}}},
    {"type": "function", "function": {
        "name": "special_function", "description": "Anything special",
        "parameters": {"type": "object", "properties": {"arg1": {"type": "boolean"}},
                       "required": ["arg1"]}}},
]
OPEN = "<tool_calls:opensource>\n<tool_call:opensource>"
CLOSE = "</tool_call:opensource>\n</tool_calls:opensource>"


@pytest.fixture(scope="module")
def apis(redis_url: str, workdir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    yield from parsed_and_raw_apis(redis_url, workdir, tmp_path_factory.mktemp("hy3"),
                                   "tencent-Hy3.jinja", "tiny-hy3")


def ask(api: str, seed: int) -> dict[str, Any]:
    response = httpx.post(api + "/v1/chat/completions", json={
        "model": "tiny-hy3", "messages": [{"role": "user", "content": "Weather?"}],
        "tools": TOOLS, "tool_choice": "required", "max_tokens": 300, "temperature": 1.0,
        "seed": seed}, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json()["choices"][0])


def test_required_writes_tagged_pairs_in_the_templates_markers(apis: tuple[str, str]) -> None:
    """Sampled under four seeds, the model writes a call in Hy3's markers, its one required
    pair as the schema allows, and the call comes back as that function's `tool_calls`."""
    parsed, raw = apis
    for seed in range(1, 5):
        text = ask(raw, seed)["message"]["content"]
        assert text.startswith(OPEN) and text.endswith(CLOSE), text
        name = text.removeprefix(OPEN).partition("<tool_sep:opensource>")[0]
        key = "days" if name == "get_weather" else "arg1"
        assert name in ("get_weather", "special_function"), text
        assert f"<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>" in text
        choice = ask(parsed, seed)
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == name
        arguments = json.loads(call["function"]["arguments"])
        assert list(arguments) == [key]
        assert arguments[key] in ((1, 2) if key == "days" else (True, False)), arguments
