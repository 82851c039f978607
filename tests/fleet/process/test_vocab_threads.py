"""The engine thread and the event loop share the vocabulary: tokenize with pieces and
detokenize hammered beside a greedy stream must not change the stream's text."""

from __future__ import annotations

import threading

import httpx

from tests.fleet.sse import read_sse
from tests.processes import Fleet

TEXT = "héllo wörld 日本語 😀 → ßñ the sky is blue " * 8
RUNS = 20


def greedy_stream(api: str) -> str:
    body = {"prompt": "once upon a time", "n_predict": 512, "temperature": 0.0,
            "ignore_eos": True, "cache_prompt": False, "stream": True}
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=120) as response:
        assert response.status_code == 200
        return "".join(event.get("content", "") for event in read_sse(response))


def hammer(api: str, stop: threading.Event, seen: list[str], failures: list[str]) -> None:
    with httpx.Client(timeout=60) as client:
        ids: list[int] = []
        while not stop.is_set():
            tokens = client.post(f"{api}/tokenize",
                                 json={"content": TEXT, "with_pieces": True}).json()["tokens"]
            pieces = [t["piece"] for t in tokens]
            text = "".join(p if isinstance(p, str) else bytes(p).decode("utf-8", "replace")
                           for p in pieces)
            ids = [t["id"] for t in tokens]
            content = client.post(f"{api}/detokenize", json={"tokens": ids}).json()["content"]
            seen.append(text)
            if content.strip() != TEXT.strip() and not failures:
                failures.append(f"detokenize gave {content[:80]!r}")


def test_vocab_is_safe_from_both_threads(tiny_fleet: Fleet) -> None:
    api = tiny_fleet.api_urls[0]
    expected = greedy_stream(api)
    assert len(expected) > 100
    for run in range(RUNS):
        stop = threading.Event()
        seen: list[str] = []
        failures: list[str] = []
        threads = [threading.Thread(target=hammer, args=(api, stop, seen, failures))
                   for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            text = greedy_stream(api)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert text == expected, f"run {run}: the stream's text changed"
        assert not failures, failures
        assert len(set(seen)) == 1, f"run {run}: tokenize pieces changed"
