"""POST /models bounded (issue 27, hole 11): an allowlist of repos (403), a size cap (413),
downloads at once fleet-wide (503 with Retry-After); and DELETE /models refuses to remove
files a live worker runs under another name (it checked the name only). A real api pod and
worker, a real Redis of the test's own, a local Hugging Face Hub stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.downloads import DownloadBoard
from storage import LocalStore
from tests.model_hosts import ModelHost, serve
from tests.processes import Fleet, start_redis, wait_until

pytestmark = pytest.mark.process


@pytest.fixture
def hub(tiny_model_path: Path) -> Iterator[ModelHost]:
    host = ModelHost()
    host.add("org/tiny-GGUF/tiny-Q4_K_M.gguf", tiny_model_path.read_bytes())
    host.add("org/big-GGUF/big-Q4_K_M.gguf", b"GGUF" + b"\0" * 3_000_000)
    host.add("other/any-GGUF/any-Q4_K_M.gguf", b"GGUF" + b"\0" * 1000)
    with serve(host):
        yield host


@pytest.fixture
def fleet(tmp_path: Path, hub: ModelHost) -> Iterator[Fleet]:
    process, url = start_redis(tmp_path / "redis")
    fleet = Fleet(url, tmp_path, ["--store-url", str(tmp_path / "store"), "--cache-dir",
                                  str(tmp_path / "cache")], logs=tmp_path / "logs",
                  env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url})
    fleet.add_api("--models-allow", "org/*", "--models-download-max-bytes", "2000000",
                  "--models-downloads-max", "1")
    try:
        yield fleet
    finally:
        fleet.stop()
        process.kill()
        process.wait()


def post(fleet: Fleet, model: str) -> httpx.Response:
    return httpx.post(f"{fleet.api_urls[0]}/models", json={"model": model, "sidecars": []},
                      timeout=30)


def test_post_models_is_bounded(fleet: Fleet) -> None:
    refused = post(fleet, "other/any-GGUF:Q4_K_M")
    assert refused.status_code == 403 and "--models-allow" in refused.json()["error"]["message"]
    too_big = post(fleet, "org/big-GGUF:Q4_K_M")
    assert too_big.status_code == 413
    assert "--models-download-max-bytes" in too_big.json()["error"]["message"]

    async def another_pod_downloads() -> None:
        redis = open_redis(fleet.redis_url)
        await DownloadBoard(redis).begin("org/elsewhere-GGUF", [])
        await redis.aclose()

    asyncio.run(another_pod_downloads())
    busy = post(fleet, "org/tiny-GGUF:Q4_K_M")
    assert busy.status_code == 503 and int(busy.headers["Retry-After"]) > 0
    assert "--models-downloads-max" in busy.json()["error"]["message"]


def test_delete_refuses_a_file_a_worker_runs_under_another_name(fleet: Fleet,
                                                                tmp_path: Path) -> None:
    url = fleet.api_urls[0]
    name = "org/tiny-GGUF:Q4_K_M"
    assert post(fleet, name).status_code == 200
    store = LocalStore(tmp_path / "store")
    wait_until(lambda: any(k.endswith("tiny-Q4_K_M.gguf")
                           for k in store.list_keys("models/hf/org/tiny-GGUF/")), 30,
               what="the download in the store")
    fleet.add_worker("-hf", name, "--alias", "served-as", "-c", "256", "-np", "1", "-t", "1",
                     "--no-warmup")
    registry = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: registry.zcard(keys.model_workers("served-as")) == 1, 90,
               what="the worker serving the file as served-as")
    refused = httpx.delete(f"{url}/models", params={"model": name}, timeout=60)
    assert refused.status_code == 400, refused.text
    assert "tiny-Q4_K_M.gguf" in refused.json()["error"]["message"]
    assert any(k.endswith("tiny-Q4_K_M.gguf") for k in store.list_keys("models/hf/org/"))
