"""llama.cpp's web UI on a router fleet (--models-dir: Gemma 3 270M and a tiny GGUF with a tiny
vision projector, tests/tiny_mmproj.py; two workers started without a model): its model
selector lists the models, loads one (POST /models/load) and unloads it (POST
/models/unload), following /models/sse; an image attached for the multimodal model is sent as
an image part and answered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, Request, expect

from tests.media_files import png
from tests.processes import Fleet, start_redis, wait_until
from tests.tiny_gguf import write_tiny_llama
from tests.tiny_mmproj import write_tiny_mmproj
from tests.ui.conftest import Shot

PROMPT = "Type a message..."
LOAD_MS = 180_000


@pytest.fixture(scope="module")
def router_ui(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[str]:
    work = tmp_path_factory.mktemp("router-ui")
    models = work / "models"
    (models / "tiny").mkdir(parents=True)
    write_tiny_llama(models / "tiny" / "tiny.gguf")
    write_tiny_mmproj(models / "tiny" / "mmproj-tiny.gguf", text_embd=64)
    (models / "gemma.gguf").symlink_to(gemma_path)
    redis_process, redis_url = start_redis(work / "redis")
    fleet = Fleet(redis_url, work, ["--store-url", str(work / "store"),
                                    "--cache-dir", str(work / "cache")], logs=work / "logs")
    try:
        for _ in range(2):
            fleet.add_worker("-c", "1024", "-np", "1", "-t", "1", "--no-warmup")
        url = fleet.add_api("--models-dir", str(models), "--models-max", "2",
                            "--ui-config", json.dumps({"max_tokens": 8}))
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 60)
        yield url
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()


def _status(url: str, model: str) -> str:
    models = {m["id"]: m for m in httpx.get(f"{url}/models").json()["data"]}
    value: str = models[model]["status"]["value"]
    return value


def _selector(page: Page, current: str) -> None:
    page.locator("button", has_text=current).last.click()
    expect(page.get_by_placeholder("Search models...")).to_be_visible()


def test_model_selector_lists_loads_and_unloads(page: Page, router_ui: str,
                                                shot: Shot) -> None:
    url = router_ui
    page.goto(f"{url}/")
    expect(page.get_by_placeholder(PROMPT)).to_be_visible()
    current = page.locator("button", has_text="gemma").last
    expect(current).to_be_visible()
    _selector(page, "gemma")
    expect(page.get_by_role("option")).to_have_count(2)
    expect(page.get_by_role("option", name="gemma")).to_be_visible()
    expect(page.get_by_role("option", name="tiny")).to_be_visible()
    expect(page.get_by_text("Available models")).to_be_visible()
    shot(page, "router-models")
    with page.expect_request(lambda r: r.url.endswith("/models/load")) as load:
        page.get_by_role("option", name="tiny").click()
    assert json.loads(load.value.post_data or "{}") == {"model": "tiny"}
    wait_until(lambda: _status(url, "tiny") == "loaded", LOAD_MS / 1000, "tiny loaded")
    _selector(page, "tiny")
    expect(page.get_by_text("Loaded models")).to_be_visible(timeout=LOAD_MS)
    tiny = page.get_by_role("option", name="tiny")
    shot(page, "router-loaded")
    tiny.hover()
    with page.expect_request(lambda r: r.url.endswith("/models/unload")) as unload:
        tiny.get_by_role("button", name="Unload model").click()
    assert json.loads(unload.value.post_data or "{}") == {"model": "tiny"}
    wait_until(lambda: _status(url, "tiny") == "unloaded", 60, "tiny unloaded")
    expect(page.get_by_text("Loaded models")).to_have_count(0, timeout=60_000)


def test_image_for_the_multimodal_model(page: Page, router_ui: str, tmp_path: Path,
                                        shot: Shot) -> None:
    url = router_ui
    image = tmp_path / "dot.png"
    image.write_bytes(png(32, 32, seed=3))
    page.goto(f"{url}/")
    expect(page.get_by_placeholder(PROMPT)).to_be_visible()
    _selector(page, "gemma")
    page.get_by_role("option", name="tiny").click()
    wait_until(lambda: _status(url, "tiny") == "loaded", LOAD_MS / 1000, "tiny loaded")
    page.locator("input[type=file]").first.set_input_files(str(image))
    expect(page.get_by_role("button", name="Preview dot.png")).to_be_visible()

    def is_chat(request: Request) -> bool:
        return request.method == "POST" and request.url.endswith("/v1/chat/completions")

    with page.expect_request(is_chat, timeout=LOAD_MS) as sent:
        page.get_by_placeholder(PROMPT).fill("What is in this picture?")
        page.keyboard.press("Enter")
    body = json.loads(sent.value.post_data or "{}")
    assert body["model"] == "tiny"
    parts = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    images = [p for p in parts if p["type"] == "image_url"]
    assert len(images) == 1 and images[0]["image_url"]["url"].startswith("data:image/")
    response = sent.value.response()
    assert response is not None and response.status == 200, response and response.text()
    response.finished()
    expect(page.get_by_role("button", name="Stop generation")).to_have_count(0)
    expect(page.locator(".chat-message-assistant").last).to_contain_text("tokens")
    shot(page, "router-image")
