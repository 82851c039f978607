"""The server's --seed makes sampled output repeatable: the same prompt gives the same text
streamed and not streamed, as llama-server does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet


@pytest.fixture(scope="module")
def seeded(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[str]:
    fleet: Fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-seeded")
    fleet.add_worker("-c", "2048", "-np", "2", "-t", "1", "--seed", "42")
    url = fleet.add_api()
    fleet.wait_healthy(url)
    yield url
    fleet.stop()


def streamed_text(url: str, body: dict[str, object]) -> str:
    text = []
    with httpx.stream("POST", f"{url}/completion", json={**body, "stream": True},
                      timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                text.append(json.loads(line[6:]).get("content", ""))
    return "".join(text)


def test_the_same_prompt_gives_the_same_text_streamed_and_not(seeded: str) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 32, "temperature": 1.0}
    whole = httpx.post(f"{seeded}/completion", json=body, timeout=120).json()["content"]
    assert whole == httpx.post(f"{seeded}/completion", json=body, timeout=120).json()["content"]
    assert streamed_text(seeded, body) == whole
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24,
            "temperature": 1.0}
    first = httpx.post(f"{seeded}/v1/chat/completions", json=chat, timeout=120).json()
    again = httpx.post(f"{seeded}/v1/chat/completions", json=chat, timeout=120).json()
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]


def test_chat_streamed_and_not_agree(seeded: str) -> None:
    chat = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 24,
            "temperature": 1.0}
    whole = httpx.post(f"{seeded}/v1/chat/completions", json=chat,
                       timeout=120).json()["choices"][0]["message"]["content"]
    pieces = []
    with httpx.stream("POST", f"{seeded}/v1/chat/completions", json={**chat, "stream": True},
                      timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    pieces.append(choice["delta"].get("content") or "")
    assert "".join(pieces) == whole
