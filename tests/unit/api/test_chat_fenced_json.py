"""An answer held to a JSON schema, fenced in Markdown (```` ```json … ``` ````, as Ministral
writes it): the fence is not content, as llama.cpp's response-format parser reads it; whole
and streamed a character at a time alike."""

from __future__ import annotations

import pytest

from api.chat.fenced_json import FencedJsonParser
from api.chat.parsing import ChatOutputParser
from tests.chat_cases import assemble


def _both(text: str) -> tuple[str, str]:
    whole = FencedJsonParser(ChatOutputParser(reasoning_format="none", tools=False))
    whole.feed(text)
    streamed = FencedJsonParser(ChatOutputParser(reasoning_format="none", tools=False))
    deltas = [d for ch in text for d in streamed.feed(ch)] + streamed.flush()
    return whole.finish().content, assemble(deltas).content


@pytest.mark.parametrize(("text", "content"), [
    ('```json\n{"amount": 1}\n```', '{"amount": 1}'),
    ('  ```json {"a": "``` inside"}```  ', '{"a": "``` inside"}'),
    ('{"amount": 1}', '{"amount": 1}'),
    ('"42"', '"42"'),
    ('```json\n{"cut": ', '{"cut": '),
    ("```js", "```js"),
    ("``", "``"),
])
def test_the_fence_is_not_content(text: str, content: str) -> None:
    assert _both(text) == (content, content)
