"""POST /v1/systemone with images (the spec's `files`, `images` and image_url parts of a state
made of chat messages) through a real fleet: Gemma 3 270M answering by prompting (--decisions)
with the tiny gemma3 projector (-mm). The images go before the state; their chunks are decoded
into the prefix's slot (the questions' copies of it hold them), the usage counts their tokens,
an image changes the numbers and the same image gives the same ones; bad bytes are a 400 and
leave the worker serving; audio goes through an audio projector, and a kind the projector does
not take is the spec's 501, naming the field."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_fleet
from tests.media_files import png, wav

QUESTIONS = {
    "table": {"type": "noul", "instructions": "Does the image contain a table?"},
    "colour": {"type": "choice", "instructions": "Which colour dominates?",
               "criteria": {"red": None, "green": None, "blue": None}},
}
IMAGE_TOKENS = 16


def uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


CAT, DOG = uri(png(80, 60, seed=7)), uri(png(50, 50, seed=8))


@pytest.fixture(scope="module")
def fleets(redis_url: str, workdir: Path, gemma_path: Path, tiny_mmproj_path: Path,
           tiny_audio_mmproj_path: Path) -> Iterator[dict[str, str]]:
    """The module's two fleets, started at once (their loads overlap): `vision`, Gemma with
    the tiny gemma3 vision projector, and `audio`, Gemma with the tiny qwen2a one."""
    vision = make_fleet(redis_url, workdir, gemma_path, "gemma-decisions-vision")
    audio = make_fleet(redis_url, workdir, gemma_path, "gemma-decisions-audio")
    try:
        vision.add_worker("-c", "4096", "-np", "4", "-t", "2", "--decisions", "-mm",
                          str(tiny_mmproj_path), "--no-mmproj-offload")
        audio.add_worker("-c", "4096", "-np", "2", "-t", "2", "--decisions", "-mm",
                         str(tiny_audio_mmproj_path), "--no-mmproj-offload")
        urls = {"vision": vision.add_api(), "audio": audio.add_api()}
        vision.wait_healthy(urls["vision"], timeout=120)
        audio.wait_healthy(urls["audio"], timeout=120)
        yield urls
    finally:
        vision.stop()
        audio.stop()


@pytest.fixture(scope="module")
def api(fleets: dict[str, str]) -> str:
    return fleets["vision"]


def ask(api: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{api}/v1/systemone", json={"questions": QUESTIONS, **body}, timeout=120)


def answers(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    data = response.json()
    assert abs(data["answers"]["colour"]["probabilities"]["red"]
               + data["answers"]["colour"]["probabilities"]["green"]
               + data["answers"]["colour"]["probabilities"]["blue"] - 1) < 1e-6
    assert 0 <= data["answers"]["table"]["noul"] <= 1
    return data


def test_an_image_is_read_before_the_state(api: str) -> None:
    text = answers(ask(api, state="A scanned page."))
    one = answers(ask(api, state="A scanned page.", images=[CAT]))
    again = answers(ask(api, state="A scanned page.", images=[CAT]))
    other = answers(ask(api, state="A scanned page.", images=[DOG]))
    assert one["answers"] == again["answers"]  # the same image: the same numbers
    assert one["answers"] != text["answers"] and one["answers"] != other["answers"]
    n_questions = len(QUESTIONS)
    assert one["usage"]["input_tokens"] >= text["usage"]["input_tokens"] \
        + n_questions * IMAGE_TOKENS  # each question's prompt holds the image's tokens


def test_files_images_and_state_parts_all_count(api: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "A scanned page."},
                                             {"type": "image_url", "image_url": {"url": DOG}}]}]
    base = answers(ask(api, state="A scanned page."))
    three = answers(ask(api, state={"messages": messages}, files=[CAT], images=[CAT]))
    two = answers(ask(api, state={"messages": messages}, files=[CAT]))
    per_question = (three["usage"]["input_tokens"] - two["usage"]["input_tokens"]) \
        / len(QUESTIONS)
    assert per_question >= IMAGE_TOKENS
    assert two["usage"]["input_tokens"] > base["usage"]["input_tokens"]


def test_bad_bytes_are_a_400_and_the_worker_goes_on(api: str) -> None:
    broken = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40
                                                         ).decode()
    response = ask(api, state="x", images=[broken])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "Failed to load image or audio file"
    answers(ask(api, state="x", images=[CAT]))


@pytest.fixture(scope="module")
def audio_api(fleets: dict[str, str]) -> str:
    return fleets["audio"]


def test_audio_is_read_by_an_audio_projector(audio_api: str) -> None:
    clip = "data:audio/wav;base64," + base64.b64encode(wav()).decode()
    text = answers(ask(audio_api, state="A recording."))
    heard = answers(ask(audio_api, state="A recording.", files=[clip]))
    assert heard["answers"] != text["answers"]
    assert heard["usage"]["input_tokens"] >= text["usage"]["input_tokens"] + len(QUESTIONS) * 750
    response = ask(audio_api, state="A recording.", files=[clip], images=[CAT])
    assert response.status_code == 501, response.text
    assert response.json()["error"]["message"] == (
        "image input is not supported by /v1/systemone here (images[0]): no multimodal "
        "projector that takes it is loaded")


def test_audio_on_a_vision_projector_is_the_specs_501(api: str) -> None:
    state = [{"role": "user", "content": [{"type": "input_audio",
                                           "input_audio": {"data": "UklGRg==",
                                                           "format": "wav"}}]}]
    response = ask(api, state=state)
    assert response.status_code == 501, response.text
    assert response.json()["error"]["message"].startswith(
        "audio input is not supported by /v1/systemone here (state[0].content[0] "
        "(input_audio)): no multimodal projector that takes it is loaded")
