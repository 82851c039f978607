"""Reading server-sent events the way a client does."""

from __future__ import annotations

import json
from typing import Any

import httpx


def read_sse(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON payloads of the `data:` events; fails on anything that is not SSE."""
    events = []
    for line in response.iter_lines():
        if not line or line.startswith((":", "id: ")):
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        events.append(json.loads(line.removeprefix("data: ")))
    return events


def stream_completion(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{api}/completion", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_sse(response)
