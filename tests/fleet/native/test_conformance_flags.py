"""Server flags whose effect clients of llama-server can see (issue 14), on a fleet of its own:
--seed, a unified KV pool that runs out, --verbose, --alias/--tags, --metrics, several --host
addresses and Vertex AI's /predict."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_fleet
from tests.fleet.sse import read_sse
from tests.processes import Fleet, free_port, wait_until

WORKER = ("-c", "256", "-np", "4", "-kvu", "--seed", "42", "--temp", "0.8", "-t", "1")


@dataclass
class Served:
    fleet: Fleet
    url: str
    second_url: str
    socket: Path


@pytest.fixture(scope="module")
def served(redis_url: str, workdir: Path, gemma_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One worker as `conform`; its api also answers as `other`, with tags, --verbose and
    --metrics, on 127.0.0.1, 127.0.0.2 and a UNIX socket, in Vertex AI prediction mode."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "conform")
    socket = tmp_path_factory.mktemp("sock") / "api.sock"
    port = free_port()
    try:
        fleet.add_worker(*WORKER)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AIP_MODE", "PREDICTION")
            env.setenv("AIP_HTTP_PORT", str(port))
            env.setenv("AIP_HEALTH_ROUTE", "/vertex-health")
            fleet._spawn("api", ["--port", "1", "--alias", "other", "--tags", "t2,t1,t2",
                                 "--verbose", "--metrics",
                                 "--host", f"127.0.0.1,127.0.0.2,{socket}"])
        url = f"http://127.0.0.1:{port}"
        fleet.wait_healthy(url, timeout=120)
        yield Served(fleet, url, f"http://127.0.0.2:{port}", socket)
    finally:
        fleet.stop()


PROMPT = "word " * 50
N_PREDICT = 20
"""Four requests of 51 + 20 tokens overflow the 256-token pool, whenever they end."""


def complete(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/completion", json=body, timeout=300)


def test_server_seed_seeds_every_request(served: Served) -> None:
    body = {"prompt": "Tell me a story about a cat.", "n_predict": 24}
    first = complete(served.url, body).json()
    assert first["generation_settings"]["seed"] == 42
    assert first["generation_settings"]["temperature"] == pytest.approx(0.8)
    assert complete(served.url, body).json()["content"] == first["content"]
    with httpx.stream("POST", f"{served.url}/completion", json={**body, "stream": True},
                      timeout=120) as response:
        streamed = "".join(event["content"] for event in read_sse(response))
    assert streamed == first["content"]


def test_exhausted_kv_pool_ends_requests_with_500(served: Served) -> None:
    body = {"prompt": PROMPT, "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": False}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: complete(served.url, body), range(4)))
    failed = [r for r in responses if r.status_code != 200]
    assert failed, "4 x 71 tokens cannot fit a 256-token pool"
    for response in failed:
        assert response.status_code == 500, response.text
        error = response.json()["error"]
        assert error["type"] == "server_error"
        assert "context size has been exceeded" in error["message"].lower()
    for response in responses:
        if response.status_code == 200:
            assert response.json()["timings"]["predicted_n"] == N_PREDICT
    again = complete(served.url, {"prompt": "Hello", "n_predict": 4})
    assert again.status_code == 200, again.text


def test_exhausted_pool_in_a_stream_is_an_error_event(served: Served) -> None:
    body = {"prompt": PROMPT, "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": False,
            "stream": True}

    def stream(_: int) -> list[dict[str, Any]]:
        with httpx.stream("POST", f"{served.url}/completion", json=body,
                          timeout=300) as response:
            assert response.status_code == 200
            return read_sse(response)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(stream, range(4)))
    errors = [events[-1]["error"] for events in streams if "error" in events[-1]]
    assert errors
    assert all("context size has been exceeded" in e["message"].lower() for e in errors)


def test_verbose_adds_debug_objects(served: Served) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(f"{served.url}/v1/chat/completions",
                      json={"messages": messages, "max_tokens": 4}, timeout=120).json()
    verbose = chat["__verbose"]
    assert verbose["stop"] is True and verbose["tokens_predicted"] == 4
    assert set(verbose) >= {"content", "generation_settings", "timings", "prompt"}
    # which parser read the answer, as llama-server names it (Gemma 3: its PEG parser)
    assert verbose["generation_settings"]["chat_format"] == "peg-native"
    assert verbose["generation_settings"]["reasoning_format"] == "auto"
    text = httpx.post(f"{served.url}/v1/completions",
                      json={"prompt": "Hi", "max_tokens": 3}, timeout=120).json()
    assert text["__verbose"]["content"] == text["choices"][0]["text"]
    assert text["__verbose"]["generation_settings"]["chat_format"] == "Content-only"
    with httpx.stream("POST", f"{served.url}/v1/completions",
                      json={"prompt": "Hi", "max_tokens": 3, "stream": True},
                      timeout=120) as response:
        chunks = [c for c in read_sse_lines(response) if isinstance(c, dict)]
    assert all("__verbose" in chunk for chunk in chunks)
    assert chunks[0]["__verbose"]["stop"] is False and chunks[-1]["__verbose"]["stop"] is True
    with httpx.stream("POST", f"{served.url}/v1/chat/completions",
                      json={"messages": messages, "max_tokens": 3, "stream": True},
                      timeout=120) as response:
        chunks = [c for c in read_sse_lines(response) if isinstance(c, dict)]
    assert sum("__verbose" in chunk for chunk in chunks) == 1
    native = complete(served.url, {"prompt": "Hi", "n_predict": 2}).json()
    assert "__verbose" not in native


def read_sse_lines(response: httpx.Response) -> list[dict[str, Any] | str]:
    import json

    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
            for line in response.iter_lines() if line.startswith("data: ")]


def test_models_list_aliases_and_tags(served: Served) -> None:
    for path in ("/v1/models", "/models"):
        body = httpx.get(f"{served.url}{path}", timeout=30).json()
        (card,) = body["data"]
        assert card["id"] == "conform"
        assert card["aliases"] == ["conform", "other"]
        assert card["tags"] == ["t1", "t2"]
        assert body["models"][0]["model"] == "conform"


def test_metrics_carry_the_process_start_time(served: Served) -> None:
    response = httpx.get(f"{served.url}/metrics", timeout=30)
    assert response.status_code == 200
    started = int(response.headers["Process-Start-Time-Unix"])
    assert time.time() - 3600 < started <= time.time()


def test_every_host_address_listens(served: Served) -> None:
    assert httpx.get(f"{served.second_url}/health", timeout=30).status_code == 200
    transport = httpx.HTTPTransport(uds=str(served.socket))
    with httpx.Client(transport=transport) as client:
        assert client.get("http://localhost/health", timeout=30).json() == {"status": "ok"}


def test_vertex_predict(served: Served) -> None:
    instances = [
        {"@requestFormat": "chatCompletions", "messages": [{"role": "user", "content": "Hi"}],
         "max_tokens": 3, "stream": True},
        {"@requestFormat": "/tokenize", "content": "Hello world"},
        {"@requestFormat": "applyTemplate", "messages": [{"role": "user", "content": "Hi"}]},
        {"@requestFormat": "nope"},
        {"messages": []},
        "not an object",
        {"@requestFormat": "chatCompletions", "messages": "x"},
    ]
    response = httpx.post(f"{served.url}/predict", json={"instances": instances}, timeout=120)
    assert response.status_code == 200, response.text
    chat, tokens, template, unknown, no_format, not_object, bad = response.json()["predictions"]
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3
    assert len(tokens["tokens"]) >= 2
    assert "Hi" in template["prompt"]
    assert unknown["error"]["message"] == "no handler registered for @requestFormat: nope"
    assert no_format["error"]["message"] == "each instance must include a string @requestFormat"
    assert not_object["error"]["message"] == "each instance must be a JSON object"
    assert bad["error"]["code"] == 400
    missing = httpx.post(f"{served.url}/predict", json={"x": 1}, timeout=30)
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == \
        "request body must include an array field named instances"
    assert httpx.get(f"{served.url}/vertex-health", timeout=30).json() == {"status": "ok"}


def test_host_flag_accepts_a_single_socket(redis_url: str, workdir: Path, gemma_path: Path,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "conform")
    socket = tmp_path_factory.mktemp("sock1") / "only.sock"
    try:
        fleet._spawn("api", ["--host", str(socket)])
        transport = httpx.HTTPTransport(uds=str(socket))
        with httpx.Client(transport=transport) as client:
            wait_until(lambda: client.get("http://localhost/health").status_code == 200,
                       60, "api on a UNIX socket")
    finally:
        fleet.stop()
