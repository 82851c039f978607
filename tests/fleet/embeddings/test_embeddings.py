"""Embeddings on a real fleet (api + worker started with --embedding) serving all-MiniLM-L6-v2,
converted from its safetensors by worker/runtime/convert_bert.py: the OpenAI SDK and raw HTTP, the
spec's shapes and errors, a numpy forward pass of the same weights as reference, and inputs of
concurrent requests sharing decodes (read from the worker's decode counter in /metrics)."""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import make_fleet
from tests.metrics_text import series
from tests.minilm_reference import MiniLMReference
from tests.processes import Fleet

SENTENCES = [
    "This is an example sentence",
    "Each sentence is converted",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
]


@pytest.fixture(scope="module")
def minilm_fleet(redis_url: str, workdir: Path, minilm_path: Path) -> Iterator[Fleet]:
    """-c 512 -np 4: four sequences per decode, 128 tokens of context each (kv not unified),
    and the physical batch of 512 tokens."""
    fleet = make_fleet(redis_url, workdir, minilm_path, "minilm")
    fleet.add_worker("--embedding", "-c", "512", "-np", "4", "-t", "1")
    url = fleet.add_api("--metrics")
    fleet.wait_healthy(url)
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def api(minilm_fleet: Fleet) -> str:
    return minilm_fleet.api_urls[0]


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> MiniLMReference:
    return MiniLMReference.from_package()


def cosine(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def test_the_converted_vocabulary_is_berts(api: str) -> None:
    tokens = httpx.post(f"{api}/tokenize", json={"content": "This is an example sentence",
                                                 "add_special": True}).json()["tokens"]
    assert tokens == [101, 2023, 2003, 2019, 2742, 6251, 102]  # bert-base-uncased's ids


def test_embeddings_match_a_numpy_forward_pass_of_the_same_weights(
        api: str, reference: MiniLMReference) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key="none")
    response = client.embeddings.create(model="minilm", input=SENTENCES,
                                        encoding_format="float")
    assert [d.index for d in response.data] == list(range(len(SENTENCES)))
    for sentence, item in zip(SENTENCES, response.data, strict=True):
        tokens = httpx.post(f"{api}/tokenize", json={"content": sentence,
                                                     "add_special": True}).json()["tokens"]
        expected = reference.embed(tokens)
        assert len(item.embedding) == 384
        assert cosine(item.embedding, expected) >= 0.999, sentence
        assert math.isclose(float(np.linalg.norm(item.embedding)), 1.0, rel_tol=1e-4)
    n_tokens = sum(len(httpx.post(f"{api}/tokenize", json={"content": s, "add_special": True})
                       .json()["tokens"]) for s in SENTENCES)
    assert response.usage.prompt_tokens == response.usage.total_tokens == n_tokens


def test_similar_sentences_rank_as_the_models_card_says(api: str) -> None:
    body = {"input": SENTENCES[2:], "encoding_format": "float"}
    vectors = [d["embedding"] for d in httpx.post(f"{api}/v1/embeddings", json=body,
                                                  timeout=60).json()["data"]]
    query = vectors[0]  # "A man is eating food."
    ranked = sorted(range(1, len(vectors)), key=lambda i: -cosine(query, vectors[i]))
    assert SENTENCES[2:][ranked[0]] == "A man is eating a piece of bread."
    assert cosine(query, vectors[1]) > 0.7 > cosine(query, vectors[4])  # bread vs violin


def test_base64_is_the_same_float32_vector(api: str) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", api_key="none")
    floats = client.embeddings.create(model="minilm", input=["hello", "world"],
                                      encoding_format="float")
    raw = httpx.post(f"{api}/v1/embeddings", json={"input": ["hello", "world"],
                                                   "encoding_format": "base64"}).json()
    assert raw["data"][0]["encoding_format"] == "base64"
    decoded = [list(struct.unpack(f"<{384}f", base64.b64decode(d["embedding"])))
               for d in raw["data"]]
    assert decoded == [d.embedding for d in floats.data]
    default = client.embeddings.create(model="minilm", input=["hello", "world"])  # SDK: base64
    assert [list(map(float, d.embedding)) for d in default.data] == decoded


def test_every_input_shape(api: str) -> None:
    def post(body: object) -> dict:
        response = httpx.post(f"{api}/v1/embeddings", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    hello = httpx.post(f"{api}/tokenize", json={"content": "hello", "add_special": True}
                       ).json()["tokens"]
    one = post({"input": "hello", "model": "my-name"})
    assert one["model"] == "my-name" and one["object"] == "list" and len(one["data"]) == 1
    assert one["data"][0]["object"] == "embedding"
    tokens = post({"input": hello})  # one token array: one input
    assert len(tokens["data"]) == 1
    assert tokens["data"][0]["embedding"] == one["data"][0]["embedding"]
    arrays = post({"input": [hello, hello[:2]]})  # an array of token arrays
    assert len(arrays["data"]) == 2  # decoded with another sequence: equal up to rounding
    assert np.allclose(arrays["data"][0]["embedding"], one["data"][0]["embedding"], atol=1e-6)
    mixed = post({"input": [101, "hello", 102]})  # mixed: one input
    assert len(mixed["data"]) == 1 and mixed["usage"]["prompt_tokens"] == 3


def test_native_answers_an_array_with_one_row_per_pooled_input(api: str) -> None:
    response = httpx.post(f"{api}/embedding", json={"content": ["hello", "world"]}).json()
    assert [item["index"] for item in response] == [0, 1]
    assert all(len(item["embedding"]) == 1 and len(item["embedding"][0]) == 384
               for item in response)
    same = httpx.post(f"{api}/embeddings", json={"input": "hello"}).json()
    assert np.allclose(same[0]["embedding"], response[0]["embedding"], atol=1e-6)
    # "content" on the OpenAI path answers natively, as llama-server does
    assert httpx.post(f"{api}/v1/embeddings", json={"content": "hello"}).json() == same


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_embd_normalize(api: str, norm: int) -> None:
    raw = np.array(httpx.post(f"{api}/embedding", json={"content": "hello", "embd_normalize": -1}
                              ).json()[0]["embedding"][0], dtype=np.float64)
    got = np.array(httpx.post(f"{api}/embedding", json={"content": "hello",
                                                        "embd_normalize": norm}
                              ).json()[0]["embedding"][0])
    if norm == -1:
        expected = raw
    elif norm == 0:
        expected = raw * 32760.0 / np.max(np.abs(raw))
    else:
        expected = raw / np.sum(np.abs(raw) ** norm) ** (1 / norm)
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(raw) > 1.5  # the raw mean-pooled vector is not unit length


@pytest.mark.parametrize(("body", "status", "kind", "message"), [
    ({"input": []}, 400, "invalid_request_error", '"input" must not be empty'),
    ({"input": [[]]}, 400, "invalid_request_error", "Input content cannot be empty"),
    ({}, 400, "invalid_request_error", '"input" or "content" must be provided'),
    ({"input": "x", "encoding_format": "hex"}, 400, "invalid_request_error",
     "The format to return the embeddings in. Can be either float or base64"),
    ({"input": [{"x": 1}]}, 400, "invalid_request_error", '"prompt" elements must be'),
    ({"input": "x", "dimensions": 8}, 400, "invalid_request_error", '"dimensions"'),
    ({"input": [1, 999999]}, 400, "invalid_request_error", "Invalid token id 999999"),
    ({"input": "word " * 600}, 500, "server_error",
     "input (602 tokens) is too large to process. increase the physical batch size "
     "(current batch size: 512)"),
])
def test_errors_as_llama_server_gives_them(api: str, body: dict, status: int, kind: str,
                                           message: str) -> None:
    response = httpx.post(f"{api}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind and message in error["message"]


def test_an_input_past_the_context_is_exceed_context_size(api: str) -> None:
    """-c 512 -np 4: llama.cpp makes each sequence's context 256 tokens, below the batch."""
    n_ctx = httpx.get(f"{api}/props").json()["default_generation_settings"]["n_ctx"]
    assert n_ctx < 512
    body = {"input": ["ok", "word " * (n_ctx - 1)]}  # with [CLS] and [SEP]: n_ctx + 1 tokens
    response = httpx.post(f"{api}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error == {"code": 400, "type": "exceed_context_size_error",
                     "message": f"input ({n_ctx + 1} tokens) is larger than the max context "
                                f"size ({n_ctx} tokens). skipping",
                     "n_prompt_tokens": n_ctx + 1, "n_ctx": n_ctx}


def test_completions_and_rerank_on_an_embedding_model_are_501(api: str) -> None:
    for path, body in (("/completion", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/rerank", {"query": "a", "documents": ["b"]})):
        response = httpx.post(f"{api}{path}", json=body)
        assert response.status_code == 501, (path, response.text)
        assert response.json()["error"]["type"] == "not_supported_error"


def test_props_and_models_say_what_the_model_serves(api: str) -> None:
    props = httpx.get(f"{api}/props").json()
    assert props["capabilities"] == ["embedding"] and props["pooling"] == "mean"
    models = httpx.get(f"{api}/v1/models").json()
    assert models["models"][0]["capabilities"] == ["embedding"]
    assert models["data"][0]["capabilities"] == ["embedding"]


def _decodes(api: str) -> tuple[float, float]:
    found = series(httpx.get(f"{api}/metrics").text)
    return found["llamacpp:n_decode_total"][1], found["llamacpp:n_busy_slots_per_decode"][1]


def _wait_metrics(api: str, predicate: object) -> tuple[float, float]:
    for _ in range(100):
        got = _decodes(api)
        if predicate(got):  # type: ignore[operator]
            return got
        import time
        time.sleep(0.1)
    return _decodes(api)


def test_the_inputs_of_one_request_share_decodes(api: str) -> None:
    before, _ = _decodes(api)
    texts = [f"sentence number {i} about a topic" for i in range(16)]
    response = httpx.post(f"{api}/v1/embeddings", json={"input": texts}, timeout=60)
    assert response.status_code == 200
    after, _ = _wait_metrics(api, lambda got: got[0] >= before + 4)
    assert after - before == 4  # 16 inputs, 4 sequences per decode (-np 4)


def test_concurrent_requests_share_decodes(api: str) -> None:
    """Requests that wait together are decoded together: fewer decodes than requests."""
    long_text = " ".join(["the quick brown fox jumps over the lazy dog"] * 10)
    n_requests = 24
    before, _ = _decodes(api)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            responses = await asyncio.gather(*(
                client.post(f"{api}/v1/embeddings", json={"input": f"{i} {long_text}"})
                for i in range(n_requests)))
        return [r.status_code for r in responses]

    assert asyncio.run(run()) == [200] * n_requests
    after, _ = _wait_metrics(api, lambda got: got[0] >= before + n_requests / 4)
    assert after - before < n_requests


def test_a_client_that_leaves_stops_its_decodes(api: str) -> None:
    """48 inputs of ~200 tokens (two per decode: 24 decodes); the client gives up after a
    moment: the worker drops the inputs not decoded yet."""
    import time

    inputs = [f"{i} " + "word " * 197 for i in range(48)]
    before, _ = _decodes(api)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{api}/v1/embeddings", json={"input": inputs}, timeout=1.5)
    previous, stable_since = -1.0, time.monotonic()
    while time.monotonic() - stable_since < 3.0:  # until the counter stops moving
        now, _ = _decodes(api)
        if now != previous:
            previous, stable_since = now, time.monotonic()
        time.sleep(0.2)
    assert previous - before < 24


def test_a_worker_killed_mid_job_hands_it_to_another(redis_url: str, workdir: Path,
                                                     minilm_path: Path) -> None:
    """An embedding job sent nothing before its worker died: it runs again on another worker
    and the client gets every embedding (no error, no duplicate)."""
    fleet = make_fleet(redis_url, workdir, minilm_path, "minilm-kill")
    try:
        victim = fleet.add_worker("--embedding", "-np", "1", "-t", "1")
        url = fleet.add_api("--metrics")
        fleet.wait_healthy(url)
        inputs = [f"{i} " + "word " * 400 for i in range(24)]  # 24 decodes of ~400 tokens

        async def run() -> httpx.Response:
            async with httpx.AsyncClient(timeout=300) as client:
                request = asyncio.create_task(client.post(f"{url}/v1/embeddings",
                                                          json={"input": inputs}))
                for _ in range(200):  # until the worker has decoded part of it
                    if _decodes(url)[0] >= 2:
                        break
                    await asyncio.sleep(0.05)
                victim.kill()
                victim.wait()
                fleet.add_worker("--embedding", "-np", "1", "-t", "1")
                return await request

        response = asyncio.run(run())
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert [d["index"] for d in data] == list(range(len(inputs)))
        retried = [line for line in httpx.get(f"{url}/metrics").text.splitlines()
                   if line.startswith("llamaq:jobs_retried_total ")]
        assert retried == ["llamaq:jobs_retried_total 1"]  # it ran again, on the new worker
    finally:
        fleet.stop()


def test_concurrent_requests_each_get_their_own_answer(api: str) -> None:
    """Requests that come together go to the workers as fewer jobs (api/embedding_batcher.py):
    each still gets exactly its own vectors, usage and errors (a bad input, or one past the
    context, fails only its own request)."""
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(12)]
    alone = {text: httpx.post(f"{api}/v1/embeddings", json={"input": text},
                              timeout=60).json() for text in texts}
    n_ctx = httpx.get(f"{api}/props").json()["default_generation_settings"]["n_ctx"]
    bodies = [{"input": text} for text in texts] + [
        {"input": [texts[0], texts[1]]}, {"input": [[]]}, {"input": ["ok", "word " * n_ctx]}]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{api}/v1/embeddings", json=body)
                                          for body in bodies))

    answers = asyncio.run(send_all())
    for text, answer in zip(texts, answers, strict=False):
        assert answer.status_code == 200, answer.text
        got, want = answer.json(), alone[text]
        assert got["usage"] == want["usage"]
        assert cosine(got["data"][0]["embedding"], want["data"][0]["embedding"]) > 0.9999
    pair = answers[len(texts)].json()
    assert [d["index"] for d in pair["data"]] == [0, 1]
    assert cosine(pair["data"][1]["embedding"], alone[texts[1]]["data"][0]["embedding"]) > 0.9999
    assert answers[-2].status_code == 400 and "Input content cannot be empty" in answers[-2].text
    assert answers[-1].json()["error"]["type"] == "exceed_context_size_error"
