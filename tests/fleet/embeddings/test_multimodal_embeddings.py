"""Embeddings of inputs with media through a real fleet (Redis, an api pod, an `--embedding
--pooling mean` worker with Gemma 3 270M and the tiny gemma3 projector), side by side with what
the vendored llama-server answered to the same requests on the same files
(tests/data/llama_server_media_embeddings.json, recorded by tests/media_embedding_cases.py):
the same status codes and error bodies, the same shapes and usage (media tokens counted), and
embeddings close to llama-server's (cosine > 0.99). Also: bad bytes do not hurt the worker,
and a large image goes through the object store."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import make_fleet
from tests.media_embedding_cases import images, projector_cases, send, text_cases
from tests.paths import DATA
from tests.processes import Fleet

RECORDED = json.loads((DATA /
                       "llama_server_media_embeddings.json").read_text())
EMBED_FLAGS = ("--embedding", "--pooling", "mean", "-c", "2048", "-np", "2", "-t", "2")
DIFFERENT: set[str] = set()
"""Cases llamaq answers differently on purpose (docs/endpoints.md): none now that video is
built (an image sent as an input_video part is read, as llama-server reads it)."""


@pytest.fixture(scope="module")
def fleets(redis_url: str, workdir: Path, gemma_path: Path,
           tiny_mmproj_path: Path) -> Iterator[tuple[str, str]]:
    vision = make_fleet(redis_url, workdir, gemma_path, "gemma-embed-vision")
    vision.add_worker(*EMBED_FLAGS, "-mm", str(tiny_mmproj_path), "--no-mmproj-offload")
    text = make_fleet(redis_url, workdir, gemma_path, "gemma-embed-text")
    text.add_worker(*EMBED_FLAGS)
    fleets: list[Fleet] = [vision, text]
    try:
        urls = (vision.add_api(), text.add_api())
        for fleet, url in zip(fleets, urls, strict=True):
            fleet.wait_healthy(url, timeout=180)
        yield urls
    finally:
        for fleet in fleets:
            fleet.stop()


@pytest.fixture(scope="module")
def vision_api(fleets: tuple[str, str]) -> str:
    return fleets[0]


@pytest.fixture(scope="module")
def answers(vision_api: str, fleets: tuple[str, str]) -> dict[str, dict[str, Any]]:
    marker = httpx.get(f"{vision_api}/props", timeout=30).json()["media_marker"]
    return {**send(vision_api, projector_cases(marker)), **send(fleets[1], text_cases())}


def vectors(body: Any) -> list[np.ndarray]:
    """Every embedding of an answer: /embedding's rows, /v1/embeddings' floats or base64."""
    if isinstance(body, list):
        return [np.array(row) for item in body for row in item["embedding"]]
    found = []
    for item in body["data"]:
        value = item["embedding"]
        if isinstance(value, str):
            raw = base64.b64decode(value)
            value = struct.unpack(f"<{len(raw) // 4}f", raw)
        found.append(np.array(value))
    return found


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def shape(body: Any) -> Any:
    """An answer without its numbers: keys, counts, dimensions, usage."""
    if isinstance(body, list):
        return [(item["index"], [len(row) for row in item["embedding"]]) for item in body]
    return {"object": body["object"], "usage": body["usage"],
            "data": [(d["index"], d["object"], d.get("encoding_format"),
                      len(d["embedding"])) for d in body["data"]]}


RECORDED_CASES = sorted({**RECORDED["projector"], **RECORDED["text"]})


@pytest.mark.parametrize("name", RECORDED_CASES)
def test_answers_as_llama_server_does(answers: dict[str, dict[str, Any]], name: str) -> None:
    expected = {**RECORDED["projector"], **RECORDED["text"]}[name]
    got = answers[name]
    if name in DIFFERENT:
        assert got["status"] == 500, got
        assert got["body"]["error"]["message"].startswith("video input is not supported - hint")
        return
    assert got["status"] == expected["status"], (got, expected["body"])
    if expected["status"] != 200:
        assert got["body"] == expected["body"]
        return
    assert shape(got["body"]) == shape(expected["body"])
    for mine, theirs in zip(vectors(got["body"]), vectors(expected["body"]), strict=True):
        assert len(mine) == len(theirs) == 640
        assert cosine(mine, theirs) > 0.99, name


def test_media_change_the_embedding_and_repeat_exactly(
        answers: dict[str, dict[str, Any]]) -> None:
    first, again, text_only = vectors(answers["native"]["body"])
    assert np.array_equal(first, again)
    assert cosine(first, text_only) < 0.999
    both = vectors(answers["oai_both_forms"]["body"])
    assert np.allclose(both[0], both[1], atol=1e-6)  # one image, the two request forms


def test_bad_bytes_leave_the_worker_serving(vision_api: str) -> None:
    marker = httpx.get(f"{vision_api}/props", timeout=30).json()["media_marker"]
    cat = base64.b64encode(images()["cat"]).decode()
    for junk in (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, images()["cat"][:200], b"GIF89a" * 3):
        body = {"input": {"prompt_string": f"a {marker} b",
                          "multimodal_data": [base64.b64encode(junk).decode()]}}
        response = httpx.post(f"{vision_api}/v1/embeddings", json=body, timeout=120)
        assert response.status_code == 500
        assert response.json()["error"]["message"] == "Failed to load image or audio file"
    body = {"input": {"prompt_string": f"a {marker} b", "multimodal_data": [cat]}}
    response = httpx.post(f"{vision_api}/v1/embeddings", json=body, timeout=120)
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] > 16  # the image's 16 tokens count


def test_a_large_image_travels_through_the_store(answers: dict[str, dict[str, Any]],
                                                 workdir: Path) -> None:
    import hashlib

    large = images()["large"]
    assert answers["large_through_the_store"]["status"] == 200
    stored = workdir / "store" / "media" / hashlib.sha256(large).hexdigest()
    assert stored.read_bytes() == large


def test_batch_lines_take_media_as_online_requests_do(vision_api: str) -> None:
    import time

    import openai

    marker = httpx.get(f"{vision_api}/props", timeout=30).json()["media_marker"]
    cat = base64.b64encode(images()["cat"]).decode()
    bad = base64.b64encode(b"no image here").decode()
    bodies = {
        "data": {"input": {"prompt_string": f"a {marker} b", "multimodal_data": [cat]}},
        "parts": {"input": [{"content": [
            {"type": "text", "text": "a "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + cat}},
            {"type": "text", "text": " b"}]}, "text alone"]},
        "corrupt": {"input": {"prompt_string": f"a {marker} b", "multimodal_data": [bad]}},
    }
    lines = "".join(json.dumps({"custom_id": name, "method": "POST", "url": "/v1/embeddings",
                                "body": body}) + "\n" for name, body in bodies.items())
    client = openai.OpenAI(base_url=f"{vision_api}/v1", api_key="none", max_retries=0,
                           timeout=60)
    file_id = client.files.create(file=("in.jsonl", lines.encode()), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    deadline = time.monotonic() + 180
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None and batch.error_file_id is not None
    output = {json.loads(line)["custom_id"]: json.loads(line)["response"]
              for line in client.files.content(batch.output_file_id).text.splitlines()}
    errors = {json.loads(line)["custom_id"]: json.loads(line)["response"]
              for line in client.files.content(batch.error_file_id).text.splitlines()}
    assert set(output) == {"data", "parts"} and set(errors) == {"corrupt"}
    assert errors["corrupt"]["status_code"] == 500
    assert errors["corrupt"]["body"]["error"]["message"] == "Failed to load image or audio file"
    for name in ("data", "parts"):
        online = httpx.post(f"{vision_api}/v1/embeddings", json=bodies[name], timeout=120)
        assert output[name]["body"]["usage"] == online.json()["usage"]
        for batched, alone in zip(vectors(output[name]["body"]), vectors(online.json()),
                                  strict=True):
            assert cosine(batched, alone) > 0.9999


def test_props_and_models_report_the_projector_of_an_embedding_worker(vision_api: str) -> None:
    props = httpx.get(f"{vision_api}/props", timeout=30).json()
    assert props["modalities"] == {"vision": True, "video": True, "audio": False}
    assert props["media_marker"].startswith("<__media_")
    card = httpx.get(f"{vision_api}/v1/models", timeout=30).json()["data"][0]
    assert card["capabilities"] == ["embedding", "multimodal"]
