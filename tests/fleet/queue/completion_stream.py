"""A streamed /completion read to its end by the preemption tests: its text and last event."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx


def read_completion(response: httpx.Response, started: threading.Event
                    ) -> tuple[str, dict[str, Any]]:
    """The stream's text and last event; `started` is set at its first event, and an error
    event fails the test (a preempted stream pauses, it never errors)."""
    text, last = "", {}
    for line in response.iter_lines():
        if line.startswith("data: "):
            last = json.loads(line.removeprefix("data: "))
            assert "error" not in last, last
            text += last.get("content", "")
            started.set()
    return text, last
