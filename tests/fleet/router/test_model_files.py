"""POST /models and DELETE /models on a real api pod, downloading from a local Hugging Face Hub
stand-in (HF_ENDPOINT) into the fleet's object store, with the spec's /models/sse events on the
models channel and the downloading / incomplete statuses; a paused download resumes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.connections import open_redis
from scheduler.downloads import DownloadBoard, DownloadStatus
from storage import LocalStore
from storage.checksum import checksum_key
from tests.model_events import ModelEvents
from tests.model_hosts import ModelHost, serve
from tests.processes import Fleet, wait_until

REPO = "org/tiny-GGUF"
PREFIX = f"models/hf/{REPO}/"


def blob(n: int, seed: int) -> bytes:
    import hashlib

    return b"GGUF" + hashlib.sha256(str(seed).encode()).digest() * (n // 32)


@pytest.fixture(scope="module")
def hub() -> Iterator[ModelHost]:
    host = ModelHost()
    host.add(f"{REPO}/tiny-Q4_K_M.gguf", blob(300_000, 4))
    host.add(f"{REPO}/tiny-Q8_0.gguf", blob(300_000, 8))
    host.add(f"{REPO}/mmproj-tiny-F16.gguf", blob(60_000, 16))
    host.add("org/slow-GGUF/slow-Q4_K_M.gguf", blob(1_500_000, 5))
    with serve(host):
        yield host


@pytest.fixture(scope="module")
def pod(redis_url: str, tmp_path_factory: pytest.TempPathFactory,
        hub: ModelHost) -> Iterator[tuple[str, Path]]:
    workdir = tmp_path_factory.mktemp("model-files")
    store = workdir / "store"
    fleet = Fleet(redis_url, workdir, ["--store-url", str(store), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs",
                  env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url})
    url = fleet.add_api()
    yield url, store
    fleet.stop()


@pytest.fixture
def events(redis_url: str) -> Iterator[ModelEvents]:
    watcher = ModelEvents(redis_url)
    yield watcher
    watcher.close()


def statuses(redis_url: str) -> dict[str, DownloadStatus]:
    async def read() -> dict[str, DownloadStatus]:
        client = open_redis(redis_url)
        try:
            return await DownloadBoard(client).statuses()
        finally:
            await client.aclose()

    return asyncio.run(read())


def request_pause(redis_url: str, model: str) -> bool:
    async def pause() -> bool:
        client = open_redis(redis_url)
        try:
            return await DownloadBoard(client).request_stop(model)
        finally:
            await client.aclose()

    return asyncio.run(pause())


def listed(url: str) -> list[str]:
    response = httpx.get(f"{url}/models", timeout=30)
    assert response.status_code == 200, response.text
    return [model["id"] for model in response.json()["data"]]


def test_post_downloads_model_and_sidecar_into_the_store(
        pod: tuple[str, Path], hub: ModelHost, events: ModelEvents, redis_url: str) -> None:
    url, store_dir = pod
    response = httpx.post(f"{url}/models", json={"model": REPO}, timeout=30)
    assert response.status_code == 200 and response.json() == {"success": True}
    events.wait(REPO, "download_finished")
    progress = events.of(REPO, "download_progress")
    assert progress, "no download_progress event"
    last = {k: v for e in progress for k, v in e["data"].items()}
    model_url = f"{hub.url}/{REPO}/resolve/main/tiny-Q4_K_M.gguf"
    size = len(hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].data)
    assert last[model_url] == {"done": size, "total": size}
    store = LocalStore(store_dir)
    assert store.list_keys(PREFIX) == sorted(
        [PREFIX + "mmproj-tiny-F16.gguf", PREFIX + "mmproj-tiny-F16.gguf.sha256",
         PREFIX + "tiny-Q4_K_M.gguf", PREFIX + "tiny-Q4_K_M.gguf.sha256"])
    assert store.get_bytes(PREFIX + "tiny-Q4_K_M.gguf") == hub.files[
        f"{REPO}/tiny-Q4_K_M.gguf"].data
    assert REPO not in statuses(redis_url)
    assert listed(url) == [f"{REPO}:Q4_K_M"]

    response = httpx.delete(f"{url}/models", params={"model": f"{REPO}:Q4_K_M",
                                                      "sidecar": "mmproj"}, timeout=30)
    assert response.status_code == 200, response.text
    assert store.list_keys(PREFIX) == [PREFIX + "tiny-Q4_K_M.gguf",
                                       PREFIX + "tiny-Q4_K_M.gguf.sha256"]

    gets = hub.gets("tiny-Q4_K_M.gguf"), hub.gets("mmproj-tiny-F16.gguf")
    response = httpx.post(f"{url}/models", json={"model": f"{REPO}:Q4_K_M"}, timeout=30)
    assert response.status_code == 200
    events.wait(f"{REPO}:Q4_K_M", "download_finished")
    # the sidecar it lacked is downloaded again, the model file already stored is kept
    assert (hub.gets("tiny-Q4_K_M.gguf"), hub.gets("mmproj-tiny-F16.gguf")) == \
        (gets[0], gets[1] + 1)
    assert store.exists(PREFIX + "mmproj-tiny-F16.gguf")
    response = httpx.delete(f"{url}/models", params={"model": f"{REPO}:Q4_K_M"}, timeout=30)
    assert response.status_code == 200 and response.json() == {"success": True}
    assert listed(url) == []  # at once: the pod that deleted it lists the sources again
    assert events.wait(f"{REPO}:Q4_K_M", "model_remove") == {
        "model": f"{REPO}:Q4_K_M", "event": "model_remove"}
    assert store.list_keys(PREFIX) == []
    response = httpx.delete(f"{url}/models", params={"model": f"{REPO}:Q4_K_M"}, timeout=30)
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize(("body", "message"), [
    ({"model": "org/absent-GGUF"}, "model validation failed, unable to download"),
    ({"model": "not a repo"}, "model validation failed, unable to download"),
    ({"model": f"{REPO}:Q5_K_M"}, "model validation failed, unable to download"),
    ({"model": ""}, "model must be a non-empty string"),
    ({}, "model must be a non-empty string"),
    ({"model": REPO, "sidecars": ["bogus"]}, "unknown sidecar kind 'bogus'"),
    ({"model": REPO, "revision": "main"}, "revision"),
])
def test_post_refuses_what_it_cannot_download(pod: tuple[str, Path], body: dict[str, Any],
                                              message: str) -> None:
    response = httpx.post(f"{pod[0]}/models", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert message in error["message"]
    if message.startswith("model validation"):
        assert response.json() == {"error": {"code": 400, "message": message,
                                             "type": "invalid_request_error"}}


def test_delete_refuses_bad_requests(pod: tuple[str, Path]) -> None:
    response = httpx.delete(f"{pod[0]}/models", timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "model must be a non-empty string"
    response = httpx.delete(f"{pod[0]}/models", params={"model": REPO, "sidecar": "x"},
                            timeout=30)
    assert response.status_code == 400 and "'x'" in response.json()["error"]["message"]
    for name in ("org/never-GGUF", "../../etc", "a\x00b", "x.gguf", "org/never-GGUF:Q4_K_M"):
        response = httpx.delete(f"{pod[0]}/models", params={"model": name}, timeout=30)
        assert response.status_code == 404, (name, response.text)
        assert response.json()["error"]["type"] == "not_found_error"


def test_paused_download_is_incomplete_and_resumes(
        pod: tuple[str, Path], hub: ModelHost, events: ModelEvents, redis_url: str) -> None:
    url, store_dir = pod
    model = "org/slow-GGUF"
    hub.chunk_delay_s = 0.05  # 1.5 MB in 64 KiB chunks: over a second
    try:
        response = httpx.post(f"{url}/models", json={"model": model, "sidecars": []},
                              timeout=30)
        assert response.status_code == 200
        wait_until(lambda: any(p.done > 0 for p in statuses(redis_url)[model].progress.values())
                   if model in statuses(redis_url) else False, what="a downloading status")
        status = statuses(redis_url)[model]
        assert status.value == "downloading"
        [(file_url, progress)] = status.to_wire()["progress"].items()
        assert file_url.endswith("/org/slow-GGUF/resolve/main/slow-Q4_K_M.gguf")
        assert progress["total"] == len(hub.files["org/slow-GGUF/slow-Q4_K_M.gguf"].data)
        again = httpx.post(f"{url}/models", json={"model": model}, timeout=30)
        assert again.status_code == 400 and "already" in again.json()["error"]["message"]

        assert request_pause(redis_url, model)  # what /models/unload does to a download
        events.wait(model, "download_failed")
        wait_until(lambda: statuses(redis_url)[model].value == "incomplete",
                   what="the incomplete status")
        assert statuses(redis_url)[model].to_wire() == {"value": "incomplete", "args": []}
    finally:
        hub.chunk_delay_s = 0.0
    response = httpx.post(f"{url}/models", json={"model": model, "sidecars": []}, timeout=30)
    assert response.status_code == 200
    events.wait(model, "download_finished")
    first, *rest = hub.ranges("slow-Q4_K_M.gguf")
    assert first is None and rest[-1] is not None and rest[-1] != "bytes=0-"  # resumed
    store = LocalStore(store_dir)
    key = "models/hf/org/slow-GGUF/slow-Q4_K_M.gguf"
    assert store.get_bytes(key) == hub.files["org/slow-GGUF/slow-Q4_K_M.gguf"].data
    assert store.exists(checksum_key(key))
    assert model not in statuses(redis_url)


def test_router_lists_downloads_and_unload_pauses_one(
        pod: tuple[str, Path], hub: ModelHost, events: ModelEvents) -> None:
    """The api pod is a router (no -m): GET /models shows a download as `downloading` with
    per-file progress, `/models/unload` pauses it (`incomplete`), and once it finished the
    model is in the list (as a cached model) after the download_finished event."""
    url, _ = pod
    model = "org/paused-GGUF"
    hub.add(f"{model}/paused-Q4_K_M.gguf", blob(1_500_000, 6))

    def listed() -> dict[str, dict[str, Any]]:
        return {m["id"]: m for m in httpx.get(f"{url}/models", timeout=30).json()["data"]}

    hub.chunk_delay_s = 0.05
    try:
        response = httpx.post(f"{url}/models", json={"model": model, "sidecars": []},
                              timeout=30)
        assert response.status_code == 200
        wait_until(lambda: listed().get(model, {}).get("status", {}).get("value")
                   == "downloading", what="a downloading model in GET /models")
        [(file_url, progress)] = listed()[model]["status"]["progress"].items()
        assert file_url.endswith(f"/{model}/resolve/main/paused-Q4_K_M.gguf")
        assert progress["total"] == 1_500_000 // 32 * 32 + 4
        unload = httpx.post(f"{url}/models/unload", json={"model": model}, timeout=30)
        assert unload.json() == {"success": True}
        events.wait(model, "download_failed")
        wait_until(lambda: listed()[model]["status"] == {"value": "incomplete", "args": []},
                   what="the incomplete status in GET /models")
    finally:
        hub.chunk_delay_s = 0.0
    response = httpx.post(f"{url}/models", json={"model": model, "sidecars": []}, timeout=30)
    assert response.status_code == 200
    events.wait(model, "download_finished")
    wait_until(lambda: f"{model}:Q4_K_M" in listed(), what="the downloaded model listed")
    item = listed()[f"{model}:Q4_K_M"]
    assert item["status"] == {"value": "unloaded"} and item["source"] == "cache"
    assert item["can_remove"] is True and model not in listed()


def test_delete_of_a_running_model_stops_it_first(redis_url: str, tmp_path: Path,
                                                  tiny_model_path: Path,
                                                  events: ModelEvents) -> None:
    """As llama-server's router: DELETE /models?model=ID of a loaded cached model stops its
    instance, then removes its files (200)."""
    repo = "org/running-GGUF"
    host = ModelHost()
    host.add(f"{repo}/running-Q4_K_M.gguf", tiny_model_path.read_bytes())
    with serve(host):
        fleet = Fleet(redis_url, tmp_path, ["--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(tmp_path / "cache")],
                      logs=tmp_path / "logs", env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": host.url})
        try:
            url = fleet.add_api()
            fleet.add_worker("-c", "256", "-np", "1", "-t", "1", "--no-warmup")
            name = f"{repo}:Q4_K_M"
            assert httpx.post(f"{url}/models", json={"model": name, "sidecars": []},
                              timeout=30).status_code == 200
            events.wait(name, "download_finished")
            httpx.get(f"{url}/models", timeout=30)  # the list is read again: the new model
            wait_until(lambda: httpx.post(f"{url}/models/load", json={"model": name},
                                          timeout=30).status_code == 200, 60,
                       what="a load (503 until the free worker has registered)")
            body = {"model": name, "prompt": "the", "n_predict": 2}
            assert httpx.post(f"{url}/completion", json=body, timeout=120).status_code == 200
            deleted = httpx.delete(f"{url}/models", params={"model": name}, timeout=90)
            assert deleted.status_code == 200, deleted.text
            assert deleted.json() == {"success": True}
            assert name not in [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]
            assert not LocalStore(tmp_path / "store").list_keys(f"models/hf/{repo}/")
        finally:
            fleet.stop()
