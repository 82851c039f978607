"""Images through a real fleet: Redis, an api pod with --media-path, a worker with Gemma 3 270M
and the tiny gemma3 projector (`-mm`, tests/tiny_mmproj.py). The chat `image_url` forms (data
URI, http(s) URL fetched by the api pod, `file://` under --media-path), `/completion`'s
`multimodal_data` with /props' media_marker, what /props and /v1/models report, llama-server's
errors, large media through the object store by hash, and a worker that outlives bad bytes."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest

from tests.conftest import WORKER_FLAGS, make_fleet
from tests.media_files import data_uri, png, wav
from tests.model_hosts import ModelHost, serve
from tests.processes import Fleet, wait_until

IMAGE_TOKENS = 16
MMPROJ_HINT = "you may need to provide the mmproj"


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("media")
    (folder / "cat.png").write_bytes(png(80, 60, seed=7))
    (folder / "sub").mkdir()
    (folder / "sub" / "dog.png").write_bytes(png(50, 50, seed=8))
    (folder.parent / "secret.png").write_bytes(png(10, 10, seed=9))
    return folder


@pytest.fixture(scope="module")
def fleets(redis_url: str, workdir: Path, gemma_path: Path, tiny_mmproj_path: Path,
           tiny_audio_mmproj_path: Path, media_dir: Path) -> Iterator[dict[str, Fleet]]:
    """The module's two models, started at once (their loads overlap): `vision`, Gemma with
    the tiny gemma3 vision projector, and `audio`, Gemma with the tiny qwen2a audio one."""
    vision = make_fleet(redis_url, workdir, gemma_path, "gemma-vision")
    audio = make_fleet(redis_url, workdir, gemma_path, "gemma-audio")
    try:
        vision.add_worker(*WORKER_FLAGS, "-mm", str(tiny_mmproj_path), "--no-mmproj-offload")
        audio.add_worker(*WORKER_FLAGS, "-mm", str(tiny_audio_mmproj_path),
                         "--no-mmproj-offload")
        vision.wait_healthy(vision.add_api("--media-path", str(media_dir),  # ModelHost's
                                           "--fetch-allow", "127.0.0.1"), timeout=120)
        audio.wait_healthy(audio.add_api(), timeout=120)
        yield {"vision": vision, "audio": audio}
    finally:
        vision.stop()
        audio.stop()


@pytest.fixture(scope="module")
def vision_fleet(fleets: dict[str, Fleet]) -> Fleet:
    return fleets["vision"]


@pytest.fixture(scope="module")
def api(vision_fleet: Fleet) -> str:
    return vision_fleet.api_urls[0]


def chat(api: str, content: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 3,
            "temperature": 0, **fields}
    return httpx.post(f"{api}/v1/chat/completions", json=body, timeout=120)


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:400]
    error = response.json()["error"]
    assert error["code"] == status
    return str(error["message"])


def test_props_and_models_report_the_projector(api: str) -> None:
    props = httpx.get(f"{api}/props", timeout=30).json()
    assert props["modalities"] == {"vision": True, "video": True, "audio": False}
    assert re.fullmatch(r"<__media_[A-Za-z0-9]{32}__>", props["media_marker"])
    card = httpx.get(f"{api}/v1/models", timeout=30).json()["data"][0]
    assert card["capabilities"] == ["completion", "multimodal"]
    assert card["architecture"]["input_modalities"] == ["text", "image"]


def test_chat_with_a_data_uri_image(api: str) -> None:
    text = chat(api, [{"type": "text", "text": "What is this?"}]).json()
    answer = chat(api, [{"type": "text", "text": "What is this?"},
                        image_part(data_uri(png(64, 64, seed=1)))])
    assert answer.status_code == 200, answer.text[:400]
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] >= text["usage"]["prompt_tokens"] + IMAGE_TOKENS
    assert usage["completion_tokens"] == 3


def test_an_image_by_http_url_is_fetched_by_the_api(api: str) -> None:
    host = ModelHost()
    host.add("pics/a.png", png(70, 40, seed=2))
    with serve(host):
        ok = chat(api, [image_part(f"{host.url}/pics/a.png"), {"type": "text", "text": "?"}])
        assert ok.status_code == 200, ok.text[:400]
        assert host.gets("pics/a.png") == 1
        missing = chat(api, [image_part(f"{host.url}/pics/none.png")])
        assert error_of(missing, 500) == "Failed to download image"


def test_a_media_url_reaches_no_private_address(vision_fleet: Fleet, redis_url: str) -> None:
    """ours (issue 43): without --fetch-allow the api pod fetches nothing from a loopback
    address (the Redis port, a server it would have fetched an image from), answering every
    failure with the same error, so the answer tells nothing of the pod's network."""
    strict = vision_fleet.add_api()
    host = ModelHost()
    host.add("pics/a.png", png(70, 40, seed=2))
    redis_port = urlsplit(redis_url).port
    with serve(host):
        for url in (f"{host.url}/pics/a.png", f"{host.url}/pics/none.png",
                    f"http://127.0.0.1:{redis_port}/", f"http://localhost:{redis_port}/",
                    "http://169.254.169.254/latest/meta-data/"):
            refused = chat(strict, [image_part(url), {"type": "text", "text": "?"}])
            assert error_of(refused, 500) == "Failed to download image", url
        assert host.gets("pics/a.png") == 0  # nothing was sent to it
    log = "".join(p.read_text(errors="replace") for p in vision_fleet.logs.glob("api-*.log"))
    assert "127.0.0.1 resolves to 127.0.0.1, which is not a public address" in log


def test_file_urls_stay_under_media_path(api: str) -> None:
    for path in ("cat.png", "sub/dog.png"):
        ok = chat(api, [image_part(f"file://{path}"), {"type": "text", "text": "?"}])
        assert ok.status_code == 200, ok.text[:400]
    assert error_of(chat(api, [image_part("file://../secret.png")]), 400) == \
        "file path is not allowed: ../secret.png"
    assert error_of(chat(api, [image_part("file:///etc/passwd")]), 400) == \
        "file path is not allowed: /etc/passwd"
    assert error_of(chat(api, [image_part("file://nope.png")]), 400) == \
        "file does not exist or cannot be opened: nope.png"


def test_completion_multimodal_data_with_the_props_marker(api: str) -> None:
    marker = httpx.get(f"{api}/props", timeout=30).json()["media_marker"]
    image = base64.b64encode(png(32, 32, seed=3)).decode()
    body = {"prompt": {"prompt_string": f"<start_of_turn>user\n{marker} describe<end_of_turn>\n"
                       "<start_of_turn>model\n", "multimodal_data": [image]},
            "n_predict": 2, "temperature": 0}
    answer = httpx.post(f"{api}/completion", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:400]
    assert answer.json()["tokens_evaluated"] >= IMAGE_TOKENS + 8
    wrong = {**body, "prompt": {"prompt_string": "no marker", "multimodal_data": [image]}}
    assert "number of media markers" in error_of(
        httpx.post(f"{api}/completion", json=wrong, timeout=60), 400)


LLAMA_SERVER_IMAGE_LOGPROBS = [(251, -3.2935), (107, -0.1076), (251, -0.9001), (107, -0.0313)]
"""The vendored llama-server's greedy answer (`n_probs` 1) to the request below, with this
fleet's model, projector and flags (`-c 4096 -np 4 -t 2 --no-mmproj-offload`), recorded Dec 2.
llama-server decodes the prompt's last 4 tokens apart (its context-checkpoint cut), media or
not: decoding them with the text before them rounds otherwise (-3.315 on the first token)."""


def test_an_image_prompt_is_decoded_as_llama_server_decodes_it(api: str) -> None:
    marker = httpx.get(f"{api}/props", timeout=30).json()["media_marker"]
    image = base64.b64encode(png(80, 60, seed=7)).decode()
    body = {"prompt": {"prompt_string": f"<start_of_turn>user\n{marker}Describe it.<end_of_turn>"
                       "\n<start_of_turn>model\n", "multimodal_data": [image]},
            "n_predict": 4, "temperature": 0, "n_probs": 1, "cache_prompt": False}
    answer = httpx.post(f"{api}/completion", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:400]
    got = [(p["id"], p["logprob"]) for p in answer.json()["completion_probabilities"]]
    assert [t for t, _ in got] == [t for t, _ in LLAMA_SERVER_IMAGE_LOGPROBS]
    for (_, ours), (_, theirs) in zip(got, LLAMA_SERVER_IMAGE_LOGPROBS, strict=True):
        assert abs(ours - theirs) < 0.005, (got, LLAMA_SERVER_IMAGE_LOGPROBS)


def test_errors_are_llama_servers(api: str) -> None:
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav()).decode(),
                                                    "format": "wav"}}
    assert MMPROJ_HINT in error_of(chat(api, [audio]), 500)  # a vision-only projector
    assert error_of(chat(api, [image_part("data:text/plain;base64,AAAA")]), 400) == \
        "Invalid uri format: data:text/plain;base64"
    assert error_of(chat(api, [image_part("data:image/png,AAAA")]), 400) == \
        "uri must be base64 encoded"
    corrupt = data_uri(png(20, 20)[:40])
    assert error_of(chat(api, [image_part(corrupt)]), 400) == "Failed to load image or audio file"


def test_large_media_travel_through_the_store(api: str, workdir: Path) -> None:
    big = png(400, 400, seed=4)  # random pixels: ~480 KB, over the 256 KiB inline limit
    assert len(big) > 256 << 10
    answer = chat(api, [image_part(data_uri(big)), {"type": "text", "text": "?"}])
    assert answer.status_code == 200, answer.text[:400]
    stored = workdir / "store" / "media" / hashlib.sha256(big).hexdigest()
    assert stored.read_bytes() == big


def test_a_repeated_image_in_the_second_turn_is_cached(api: str) -> None:
    image = image_part(data_uri(png(120, 90, seed=5)))
    first_turn = [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
    first = httpx.post(f"{api}/v1/chat/completions", timeout=120, json={
        "messages": first_turn, "max_tokens": 2, "temperature": 0, "id_slot": 1}).json()
    second = httpx.post(f"{api}/v1/chat/completions", timeout=120, json={
        "messages": [*first_turn, {"role": "assistant", "content": "a thing"},
                     {"role": "user", "content": "and its colour?"}],
        "max_tokens": 2, "temperature": 0, "id_slot": 1}).json()
    cached = second["timings"]["cache_n"]
    assert cached >= first["usage"]["prompt_tokens"] - 1, second["timings"]
    assert second["timings"]["prompt_n"] < second["usage"]["prompt_tokens"] - IMAGE_TOKENS


def test_bad_bytes_never_kill_the_worker(api: str, vision_fleet: Fleet) -> None:
    rng = np.random.default_rng(28)
    good = png(30, 30, seed=6)
    statuses = set()
    for i in range(40):
        data = good[: int(rng.integers(1, len(good)))] if i % 2 else \
            rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8).tobytes()
        response = chat(api, [image_part(data_uri(data)), {"type": "text", "text": "?"}])
        statuses.add(response.status_code)
        if response.status_code != 200:
            assert error_of(response, 400) == "Failed to load image or audio file"
    assert statuses <= {200, 400}
    assert all(process.poll() is None for process in vision_fleet.processes)
    assert chat(api, [image_part(data_uri(good))]).status_code == 200


def test_anthropic_image_blocks(api: str) -> None:
    """base64 and URL sources (the SDK's shapes), converted as llama-server converts them."""
    import anthropic

    client = anthropic.Anthropic(base_url=api, api_key="x", max_retries=0)
    create: Any = client.messages.create  # the SDK's TypedDicts, given as plain dicts
    encoded = base64.b64encode(png(48, 48, seed=11)).decode()
    host = ModelHost()
    host.add("b.png", png(40, 40, seed=12))
    with serve(host):
        for source in ({"type": "base64", "media_type": "image/png", "data": encoded},
                       {"type": "url", "url": f"{host.url}/b.png"}):
            message = create(
                model="gemma-vision", max_tokens=2, messages=[{"role": "user", "content": [
                    {"type": "image", "source": source}, {"type": "text", "text": "?"}]}])
            assert message.usage.input_tokens >= IMAGE_TOKENS
        assert host.gets("b.png") == 1


def test_responses_input_image(api: str) -> None:
    body = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": data_uri(png(33, 33, seed=13))}]}],
        "max_output_tokens": 2, "temperature": 0}
    answer = httpx.post(f"{api}/v1/responses", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:400]
    assert answer.json()["usage"]["input_tokens"] >= IMAGE_TOKENS


def test_apply_template_puts_the_marker_and_tokenize_takes_text(api: str) -> None:
    marker = httpx.get(f"{api}/props", timeout=30).json()["media_marker"]
    content = [{"type": "text", "text": "see"}, image_part(data_uri(png(8, 8))),
               {"type": "text", "text": "then"}, {"type": "text", "text": "more"}]
    answer = httpx.post(f"{api}/apply-template", timeout=60,
                        json={"messages": [{"role": "user", "content": content}]})
    assert answer.status_code == 200, answer.text[:400]
    # llama.cpp's join: newlines between text parts, none around a media marker
    assert f"see{marker}then\nmore" in answer.json()["prompt"]
    missing = httpx.post(f"{api}/apply-template", timeout=60, json={"messages": [
        {"role": "user", "content": [image_part("file://nope.png")]}]})
    assert error_of(missing, 400) == "file does not exist or cannot be opened: nope.png"
    # /tokenize takes text only: the marker is text there, as in llama-server
    tokens = httpx.post(f"{api}/tokenize", json={"content": marker}, timeout=60).json()["tokens"]
    assert len(tokens) > 1


def test_every_worker_of_the_model_uses_one_marker(api: str, vision_fleet: Fleet,
                                                   tiny_mmproj_path: Path) -> None:
    """The first worker's random marker is the model's (Redis); a second worker takes it, so
    a prompt written with /props' marker runs on either."""
    import asyncio

    from scheduler.connections import open_redis
    from scheduler.contract import keys
    from scheduler.registry import Registry

    marker = httpx.get(f"{api}/props", timeout=30).json()["media_marker"]
    vision_fleet.add_worker(*WORKER_FLAGS, "-mm", str(tiny_mmproj_path), "--no-mmproj-offload")

    async def markers() -> tuple[str | None, list[str]]:
        redis = open_redis(vision_fleet.redis_url)
        try:
            stored = await redis.get(keys.media_marker("gemma-vision"))
            workers = await Registry(redis).live_workers("gemma-vision")
            return (stored.decode() if stored else None), [w.meta.media_marker for w in workers]
        finally:
            await redis.aclose()

    wait_until(lambda: len(asyncio.run(markers())[1]) == 2, timeout=120, what="second worker")
    stored, reported = asyncio.run(markers())
    assert stored == marker and reported == [marker, marker]


@pytest.fixture(scope="module")
def audio_api(fleets: dict[str, Fleet]) -> str:
    """A second model: Gemma with the tiny qwen2a audio projector."""
    return fleets["audio"].api_urls[0]


def test_chat_with_input_audio(audio_api: str) -> None:
    props = httpx.get(f"{audio_api}/props", timeout=30).json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": True}
    assert httpx.get(f"{audio_api}/v1/models", timeout=30).json()["data"][0][
        "architecture"]["input_modalities"] == ["text", "audio"]
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(1.0)).decode(),
                                                    "format": "wav"}}
    answer = chat(audio_api, [audio, {"type": "text", "text": "what was said?"}])
    assert answer.status_code == 200, answer.text[:400]
    assert answer.json()["usage"]["prompt_tokens"] >= 750  # 30 s chunk: 750 audio tokens
    assert MMPROJ_HINT in error_of(chat(audio_api, [image_part(data_uri(png(8, 8)))]), 500)
    noise = {"type": "input_audio", "input_audio": {
        "data": base64.b64encode(b"RIFF" + bytes(40)).decode(), "format": "wav"}}
    assert error_of(chat(audio_api, [noise]), 400) == "Failed to load image or audio file"
