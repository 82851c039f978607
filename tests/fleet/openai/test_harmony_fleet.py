"""gpt-oss through a real fleet (Redis, an api pod, a worker): a tiny GGUF whose vocabulary has
harmony's tokens as CONTROL tokens (as gpt-oss's has) and gpt-oss's real chat template
(tests/data/templates). A grammar makes the random model write a harmony answer; the api
detects the template, the job carries the preserved tokens over Redis, the worker writes them
as text, and the answer comes back split into reasoning_content and content, streamed (raw SSE
and the openai SDK) and not. The answers are llama-server's (its binary, the same GGUF and
grammar: reasoning "hm", content "ok"; "none": the raw analysis block in content)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from api.chat.harmony import CALL, PRESERVED_TOKENS, RETURN
from tests.conftest import make_fleet
from tests.paths import DATA
from tests.processes import Fleet
from tests.tiny_gguf import vocabulary, write_tiny_llama

pytestmark = pytest.mark.process

TEMPLATE = (DATA / "templates" /
            "openai-gpt-oss-120b.jinja").read_text("utf-8")
CONTROL = (*PRESERVED_TOKENS, CALL, RETURN)


def token(text: str) -> str:
    """A grammar's reference to the tiny vocabulary's token for `text`."""
    tokens, _, _ = vocabulary(CONTROL)
    return f"<[{tokens.index(text)}]>"


GRAMMAR = (f'root ::= {token("<|channel|>")} "analysis" {token("<|message|>")} "hm" '
           f'{token("<|end|>")} {token("<|start|>")} "assistant" {token("<|channel|>")} '
           f'"final" {token("<|message|>")} "ok"')


@pytest.fixture(scope="module")
def api(redis_url: str, workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_tiny_llama(tmp_path_factory.mktemp("harmony") / "harmony.gguf",
                             control=CONTROL, chat_template=TEMPLATE)
    fleet: Fleet = make_fleet(redis_url, workdir, model, "tiny-harmony")
    fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
    url = fleet.add_api()
    fleet.wait_healthy(url)
    yield url
    fleet.stop()


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny-harmony", "messages": [{"role": "user", "content": "hi"}],
            "grammar": GRAMMAR, "max_tokens": 200, "temperature": 0.0, **extra}


def test_reasoning_and_content_whole(api: str) -> None:
    response = httpx.post(f"{api}/v1/chat/completions", json=body(), timeout=120)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == ("hm", "ok")
    raw = httpx.post(f"{api}/v1/chat/completions", json=body(reasoning_format="none"),
                     timeout=120).json()["choices"][0]["message"]
    assert raw["content"] == "<|channel|>analysis<|message|>hm<|end|>ok"
    legacy = httpx.post(f"{api}/v1/chat/completions", json=body(reasoning_format="deepseek-legacy"),
                        timeout=120).json()["choices"][0]["message"]
    assert (legacy.get("reasoning_content"), legacy["content"]) == ("hm", "ok")


def test_reasoning_and_content_streamed(api: str) -> None:
    reasoning, content = "", ""
    with httpx.stream("POST", f"{api}/v1/chat/completions", json=body(stream=True),
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice.get("delta", {})
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                assert "<|" not in (delta.get("content") or "")
    assert (reasoning, content) == ("hm", "ok")


def test_openai_sdk(api: str) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key="x", max_retries=0, timeout=120)
    extra = {"grammar": GRAMMAR}
    completion = client.chat.completions.create(
        model="tiny-harmony", messages=[{"role": "user", "content": "hi"}], max_tokens=200,
        temperature=0.0, extra_body=extra)
    message = completion.choices[0].message
    assert message.content == "ok"
    assert getattr(message, "reasoning_content", None) == "hm"
