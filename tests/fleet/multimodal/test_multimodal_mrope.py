"""M-RoPE media through a real fleet: Redis, an api pod and a worker with the tiny `qwen2vl`
text model and its `qwen2vl_merger` projector (`-mm`, tests/tiny_qwen2vl.py). A chat image,
`/completion`'s `multimodal_data`, prompt token counts that hold the image's tokens, and a
second turn that reuses the slot's cache and answers what a fresh evaluation answers (the
positions after the image are counted by its n_pos, worker/runtime/media.py)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import WORKER_FLAGS, make_fleet
from tests.media_files import data_uri, mp4, png
from tests.processes import Fleet
from tests.tiny_qwen2vl import write_tiny_qwen2vl, write_tiny_qwen2vl_mmproj

MIN_IMAGE_TOKENS = 8  # clip.cpp's least for Qwen-VL images


@pytest.fixture(scope="module")
def api(redis_url: str, workdir: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("qwen2vl-fleet")
    model = write_tiny_qwen2vl(folder / "tiny-qwen2vl.gguf")
    mmproj = write_tiny_qwen2vl_mmproj(folder / "mmproj-tiny-qwen2vl.gguf")
    fleet: Fleet = make_fleet(redis_url, workdir, model, "qwen-vision")
    fleet.add_worker(*WORKER_FLAGS, "-mm", str(mmproj), "--no-mmproj-offload")
    url = fleet.add_api()
    fleet.wait_healthy(url, timeout=120)
    yield url
    fleet.stop()


def chat(api: str, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, **fields}
    answer = httpx.post(f"{api}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:400]
    return dict(answer.json())


def image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(data)}}


def test_props_report_vision(api: str) -> None:
    props = httpx.get(f"{api}/props", timeout=30).json()
    assert props["modalities"] == {"vision": True, "video": True, "audio": False}


def test_an_image_chat_counts_the_image_and_a_second_turn_reuses_it(api: str) -> None:
    image = image_part(png(200, 140, seed=1))
    text = chat(api, [{"role": "user", "content": "what?"}], id_slot=0)
    first_turn = [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
    first = chat(api, first_turn, id_slot=1)
    assert first["usage"]["prompt_tokens"] >= text["usage"]["prompt_tokens"] + MIN_IMAGE_TOKENS
    assert first["usage"]["completion_tokens"] == 6
    reply = first["choices"][0]["message"]["content"]
    second_turn = [*first_turn, {"role": "assistant", "content": reply},
                   {"role": "user", "content": "and its colour?"}]
    second = chat(api, second_turn, id_slot=1)
    timings = second["timings"]
    assert timings["cache_n"] >= first["usage"]["prompt_tokens"], timings
    assert timings["prompt_n"] == second["usage"]["prompt_tokens"] - timings["cache_n"]
    assert timings["prompt_n"] < second["usage"]["prompt_tokens"] - MIN_IMAGE_TOKENS
    fresh = chat(api, second_turn, id_slot=0, cache_prompt=False)
    assert fresh["timings"]["cache_n"] == 0
    assert fresh["choices"][0]["message"]["content"] == \
        second["choices"][0]["message"]["content"]
    assert fresh["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]


def test_completion_multimodal_data(api: str) -> None:
    marker = httpx.get(f"{api}/props", timeout=30).json()["media_marker"]
    image = base64.b64encode(png(64, 96, seed=2)).decode()
    prompt = f"<|im_start|>user\n{marker} describe<|im_end|>\n<|im_start|>assistant\n"
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [image]},
            "n_predict": 4, "temperature": 0}
    answer = httpx.post(f"{api}/completion", json=body, timeout=120)
    assert answer.status_code == 200, answer.text[:400]
    result = answer.json()
    assert result["tokens_predicted"] == 4
    assert result["tokens_evaluated"] >= MIN_IMAGE_TOKENS + 5


def test_chat_with_input_video(api: str) -> None:
    """`input_video` (and `video_url`, its OpenAI-style alias) parts: the worker reads the
    frames through ffmpeg; the prompt counts every frame's tokens; bad bytes are the 400."""
    video = data_uri(mp4(seconds=1.0), "video/mp4")
    text = chat(api, [{"role": "user", "content": "what happens?"}])
    for part in ({"type": "input_video", "input_video": {"data": video}},
                 {"type": "video_url", "video_url": {"url": video}}):
        answer = chat(api, [{"role": "user", "content": [part, {"type": "text",
                                                               "text": "what happens?"}]}])
        # at least three frames of at least 8 tokens each
        assert answer["usage"]["prompt_tokens"] >= text["usage"]["prompt_tokens"] + 24
    broken = data_uri(mp4(seconds=1.0)[:300], "video/mp4")
    bad = httpx.post(f"{api}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": [
            {"type": "input_video", "input_video": {"data": broken}}]}], "max_tokens": 2})
    assert bad.status_code == 400, bad.text[:300]
    assert bad.json()["error"]["message"] == "Failed to load image or audio file"
