"""The requests whose answers' shapes are compared with llama-server's (the same for both:
bench/record_llama_server_keys.py records llama-server's,
tests/fleet/native/test_llama_server_keys.py checks llamaq's)."""

from __future__ import annotations

import httpx

from tests.key_paths import key_paths

FLAGS = ["-c", "1024", "-np", "2", "-t", "1", "--metrics", "--seed", "42"]
"""The flags both servers run with."""


def probe(url: str) -> dict[str, dict[str, str]]:
    """Each probed endpoint's key paths and value types."""
    found: dict[str, dict[str, str]] = {}
    found["GET /props"] = key_paths(httpx.get(f"{url}/props", timeout=30).json())
    found["POST /completion"] = key_paths(httpx.post(
        f"{url}/completion", json={"prompt": "Hello", "n_predict": 4}, timeout=120).json())
    found["POST /v1/chat/completions"] = key_paths(httpx.post(
        f"{url}/v1/chat/completions", timeout=120,
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).json())
    found["GET /slots"] = key_paths(httpx.get(f"{url}/slots", timeout=30).json())  # used now
    return found
