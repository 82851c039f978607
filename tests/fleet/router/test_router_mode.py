"""Router mode end to end: two models (Gemma and a tiny GGUF written here, plus a corrupt one)
in a --models-dir, three workers started without a model, two api pods, --models-max 2.

Routing by name with llama-server's errors, load/unload, /models/sse events seen from the
other pod, the LRU unload under --models-max, a failed load shown as failed with its exit
code, and /metrics, /slots, /props taking ?model=.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.media_files import png
from tests.processes import Fleet, start_redis, wait_until
from tests.tiny_gguf import write_tiny_llama
from tests.tiny_mmproj import write_tiny_mmproj

pytestmark = pytest.mark.process  # starts llamaq or redis-server (tests/lanes.py)

WORKER = ("-c", "512", "-np", "1", "-t", "1", "--no-warmup")
LOAD_S = 180


class Events:
    """A client of GET /models/sse, reading in a thread."""

    def __init__(self, url: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.connected = threading.Event()
        threading.Thread(target=self._read, args=(url,), daemon=True).start()

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("GET", f"{url}/models/sse", timeout=None) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                self.connected.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line.removeprefix("data: ")))
        except httpx.HTTPError:  # the pod stopped at the end of the module
            return

    def wait_for(self, model: str, status: str, timeout: float = LOAD_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event.get("model") == model and event.get("data", {}).get("status") == status:
                    return event
            time.sleep(0.1)
        raise AssertionError(f"no {status} event for {model}: {self.events}")


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("router")
    models = work / "models"
    (models / "tiny").mkdir(parents=True)
    write_tiny_llama(models / "tiny" / "tiny.gguf")
    # a real projector (tests/tiny_mmproj.py) for the tiny model's 64-wide embeddings: the
    # router loads the sidecar it advertises (issue 28)
    write_tiny_mmproj(models / "tiny" / "mmproj-tiny.gguf", text_embd=64)
    (models / "gemma.gguf").symlink_to(gemma_path)
    corrupt = write_tiny_llama(models / "corrupt.gguf")
    corrupt.write_bytes(corrupt.read_bytes()[: corrupt.stat().st_size // 2])
    redis_process, redis_url = start_redis(work / "redis")
    common = ["--store-url", str(work / "store"), "--cache-dir", str(work / "cache")]
    fleet = Fleet(redis_url, work, common, logs=work / "logs")
    try:
        for _ in range(3):
            fleet.add_worker(*WORKER)
        for _ in range(2):
            fleet.add_api("--models-dir", str(models), "--models-max", "2", "--metrics")
        wait_until(lambda: httpx.get(f"{fleet.api_urls[0]}/health").status_code == 200, 60)
        yield fleet
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()


@pytest.fixture(scope="module")
def pods(router: Fleet) -> tuple[str, str]:
    return router.api_urls[0], router.api_urls[1]


@pytest.fixture(scope="module")
def events(pods: tuple[str, str]) -> Events:
    """Events as pod B sees them (loads and unloads are asked on pod A)."""
    reader = Events(pods[1])
    assert reader.connected.wait(30)
    return reader


def listing(url: str) -> dict[str, dict[str, Any]]:
    body = httpx.get(f"{url}/models", timeout=30).json()
    assert body["object"] == "list"
    return {item["id"]: item for item in body["data"]}


def status(url: str, model: str) -> dict[str, Any]:
    result: dict[str, Any] = listing(url)[model]["status"]
    return result


def error(response: httpx.Response, code: int, message: str, kind: str) -> None:
    assert response.status_code == code, response.text
    assert response.json() == {"error": {"code": code, "message": message, "type": kind}}


def test_every_model_is_listed_unloaded_with_offline_architecture(
        pods: tuple[str, str], events: Events) -> None:
    for url in pods:
        models = listing(url)
        assert sorted(models) == ["corrupt", "gemma", "tiny"]
        for item in models.values():
            assert item["status"] == {"value": "unloaded"}
            assert item["object"] == "model" and item["owned_by"] == "llamacpp"
            assert item["source"] == "models_dir"
        tiny = models["tiny"]
        assert tiny["sidecars"] == ["mmproj"]
        assert tiny["architecture"] == {"input_modalities": ["text", "image"],
                                        "output_modalities": ["text"]}
        assert models["gemma"]["architecture"]["input_modalities"] == ["text"]
        v1 = httpx.get(f"{url}/v1/models").json()
        assert sorted(item["id"] for item in v1["data"]) == ["corrupt", "gemma", "tiny"]
    assert httpx.get(f"{pods[0]}/health").json() == {"status": "ok"}
    props = httpx.get(f"{pods[0]}/props").json()
    assert props["role"] == "router" and props["max_instances"] == 2
    assert props["models_autoload"] is True


def test_requests_are_checked_as_llama_server_checks_them(pods: tuple[str, str]) -> None:
    url = pods[0]
    body = {"prompt": "hi", "n_predict": 2}
    missing = "model name is missing from the request"
    error(httpx.post(f"{url}/completion", json=body), 400, missing, "invalid_request_error")
    error(httpx.post(f"{url}/completion", json={**body, "model": "nope"}), 400,
          "model 'nope' not found", "invalid_request_error")
    error(httpx.post(f"{url}/completion?autoload=false", json={**body, "model": "tiny"}), 400,
          "model is not loaded", "invalid_request_error")
    error(httpx.get(f"{url}/metrics"), 400, missing, "invalid_request_error")
    error(httpx.get(f"{url}/slots"), 400, missing, "invalid_request_error")
    error(httpx.get(f"{url}/lora-adapters"), 400, missing, "invalid_request_error")
    error(httpx.post(f"{url}/lora-adapters", json=[]), 400, missing, "invalid_request_error")
    error(httpx.get(f"{url}/props?model=tiny&autoload=false"), 400, "model is not loaded",
          "invalid_request_error")
    error(httpx.post(f"{url}/models/load", json={"model": "nope"}), 404, "model is not found",
          "not_found_error")
    error(httpx.post(f"{url}/models/unload", json={"model": "tiny"}), 400,
          "model is not running", "invalid_request_error")
    assert status(url, "tiny") == {"value": "unloaded"}  # nothing was loaded by the above


def test_batches_say_they_need_a_pod_with_a_model(pods: tuple[str, str]) -> None:
    """A batch runs on the model of the pod that took it: a router pod refuses the Files and
    Batch API by name (501), never a misleading 400 or a batch that waits forever."""
    url = pods[0]
    needs = ("the Files and Batch API (/v1/files, /v1/batches) is not served in router mode: "
             "send it to an api pod started with a model (-m)")
    error(httpx.post(f"{url}/v1/files", data={"purpose": "batch"},
                     files={"file": ("in.jsonl", b"{}")}), 501, needs, "not_supported_error")
    error(httpx.post(f"{url}/v1/batches", json={"input_file_id": "file-x", "completion_window":
                                                "24h", "endpoint": "/v1/completions"}),
          501, needs, "not_supported_error")
    error(httpx.post(f"{url}/v1/batches/batch_x/cancel"), 501, needs, "not_supported_error")
    error(httpx.get(f"{url}/v1/batches"), 501, needs, "not_supported_error")


def test_load_routes_by_name_and_the_other_pod_sees_the_events(
        pods: tuple[str, str], events: Events) -> None:
    a, b = pods
    assert httpx.post(f"{a}/models/load", json={"model": "tiny"}).json() == {"success": True}
    events.wait_for("tiny", "loading")
    info = events.wait_for("tiny", "loaded")["data"]["info"]
    assert info["id"] == "tiny" and info["n_ctx"] == 512 and info["meta"]["n_vocab"] > 0
    # llama-server's stages: the text model, then the projector, each from 0 to 1, in order
    progress = [e["data"]["progress"] for e in events.events
                if e.get("model") == "tiny" and "progress" in e.get("data", {})]
    assert progress and all(p["stages"] == ["text_model", "mmproj_model"] for p in progress)
    currents = [p["current"] for p in progress]
    assert currents == sorted(currents, key=["text_model", "mmproj_model"].index), currents
    assert [p["value"] for p in progress if p["current"] == "mmproj_model"][-1] == 1.0
    loaded = status(b, "tiny")
    assert loaded["value"] == "loaded" and loaded["args"][:2] == ["llamaq", "worker"]
    assert "--alias" in loaded["args"]
    error(httpx.post(f"{a}/models/load", json={"model": "tiny"}), 400,
          "model is already running", "invalid_request_error")
    result = httpx.post(f"{b}/completion", json={"model": "tiny", "prompt": "the sky",
                                                 "n_predict": 4, "ignore_eos": True}, timeout=60)
    assert result.status_code == 200, result.text
    assert result.json()["tokens_predicted"] == 4
    assert result.json()["model"] == "tiny"
    assert "-mm" in loaded["args"]  # the folder's mmproj sidecar, loaded
    marker = httpx.get(f"{b}/props?model=tiny").json()["media_marker"]
    image = base64.b64encode(png(20, 20)).decode()
    seen = httpx.post(f"{b}/completion", timeout=60, json={
        "model": "tiny", "n_predict": 0,  # no tokens: the metrics below count 4
        "prompt": {"prompt_string": f"look {marker} ok", "multimodal_data": [image]}})
    assert seen.status_code == 200, seen.text
    assert seen.json()["tokens_evaluated"] >= 16
    assert listing(b)["tiny"]["meta"]["n_vocab"] > 0  # the loaded instance's info, merged
    workers = httpx.get(f"{b}/fleet").json()["workers"]
    assert [w["model_id"] for w in workers] == ["tiny"]  # the web UI's fleet page


def test_autoload_and_model_query_on_get_routes(pods: tuple[str, str],
                                                events: Events) -> None:
    a, b = pods
    chat = {"model": "gemma", "messages": [{"role": "user", "content": "Say hi"}],
            "max_tokens": 3}
    response = httpx.post(f"{a}/v1/chat/completions", json=chat, timeout=LOAD_S)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "gemma"
    events.wait_for("gemma", "loaded")
    assert status(b, "gemma")["value"] == "loaded"
    stages = [e["data"]["progress"] for e in events.events
              if e.get("model") == "gemma" and "progress" in e.get("data", {})]
    assert stages and all(p["stages"] == ["text_model"] and p["current"] == "text_model"
                          for p in stages)
    values = [p["value"] for p in stages]
    assert values == sorted(values) and values[0] >= 0 and values[-1] == 1.0
    metrics = httpx.get(f"{b}/metrics?model=tiny")
    assert metrics.status_code == 200 and "llamacpp:tokens_predicted_total 4" in metrics.text
    slots = httpx.get(f"{b}/slots?model=gemma").json()
    assert len(slots) == 1 and slots[0]["n_ctx"] == 512
    props = httpx.get(f"{b}/props?model=gemma").json()
    assert props["model_alias"] == "gemma" and props["total_slots"] == 1
    assert httpx.get(f"{b}/lora-adapters?model=gemma").json() == []
    assert httpx.post(f"{b}/lora-adapters?model=gemma", json=[]).json() == {"success": True}


def test_models_max_unloads_the_lru_model_and_a_corrupt_file_fails(
        pods: tuple[str, str], events: Events) -> None:
    a, b = pods
    # tiny was last used before gemma: at --models-max 2 it is the one to go
    assert httpx.post(f"{a}/models/load", json={"model": "corrupt"}).json() == {"success": True}
    events.wait_for("tiny", "unloaded")
    failed = events.wait_for("corrupt", "unloaded")
    assert failed["data"]["exit_code"] == 1
    wait_until(lambda: status(b, "corrupt").get("failed"), 30, what="failed status")
    shown = status(b, "corrupt")
    assert shown["value"] == "unloaded" and shown["failed"] is True
    assert shown["exit_code"] == 1 and "--alias" in shown["args"]
    assert status(b, "tiny") == {"value": "unloaded"}
    assert status(b, "gemma")["value"] == "loaded"
    response = httpx.post(f"{b}/completion", json={"model": "corrupt", "prompt": "x"},
                          timeout=LOAD_S)
    error(response, 500, "model name=corrupt failed to load", "server_error")


def test_unload_frees_the_model_everywhere(pods: tuple[str, str], events: Events) -> None:
    a, b = pods
    assert httpx.post(f"{a}/models/unload", json={"model": "gemma"}).json() == {"success": True}
    events.wait_for("gemma", "unloaded", timeout=60)
    assert status(b, "gemma") == {"value": "unloaded"}
    error(httpx.post(f"{b}/models/unload", json={"model": "gemma"}), 400,
          "model is not running", "invalid_request_error")
    # three free workers again: the tiny model loads on demand through pod B
    response = httpx.post(f"{b}/v1/completions", json={"model": "tiny", "prompt": "a",
                                                       "max_tokens": 2}, timeout=LOAD_S)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "tiny"


def ids(response: httpx.Response) -> list[str]:
    return [item["id"] for item in response.json()["data"]]


def test_reload_reads_the_sources_again_on_every_pod(router: Fleet, pods: tuple[str, str],
                                                     events: Events) -> None:
    a, b = pods
    models = router.workdir / "models"
    write_tiny_llama(models / "extra.gguf")
    assert "extra" not in listing(b)  # the catalog is read at start and on reload only
    assert "extra" in ids(httpx.get(f"{a}/models?reload=1"))
    wait_until(lambda: any(e.get("event") == "models_reload" and e.get("model") == "*"
                           for e in events.events), 30, what="models_reload event")
    wait_until(lambda: "extra" in listing(b), 30, what="pod B reloads too")
    (models / "extra.gguf").unlink()
    assert "extra" not in ids(httpx.get(f"{b}/models?reload=1"))
    wait_until(lambda: any(e == {"model": "extra", "event": "model_remove"}
                           for e in events.events), 30, what="model_remove event")
    wait_until(lambda: "extra" not in listing(a), 30, what="pod A reloads too")


def test_a_router_without_free_workers_answers_503_at_once(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    redis_process, redis_url = start_redis(tmp_path / "redis")
    fleet = Fleet(redis_url, tmp_path, ["--store-url", str(tmp_path / "store")],
                  logs=tmp_path / "logs")
    try:
        # no cold-start hold (tests/fleet/queue/test_cold_start.py: with one, it waits)
        url = fleet.add_api("--models-dir", str(models), "--cold-start-timeout", "0")
        started = time.monotonic()
        response = httpx.post(f"{url}/completion", json={"model": "tiny", "prompt": "a"},
                              timeout=60)
        error(response, 503, "no worker can load a model: every worker was started with -m "
              "(start workers without -m)", "unavailable_error")
        assert response.headers["Retry-After"] == "5"
        assert time.monotonic() - started < 10
        load = httpx.post(f"{url}/models/load", json={"model": "tiny"})
        assert load.status_code == 503 and "cannot load model 'tiny' now" in load.text
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()


def test_a_serving_model_is_never_evicted_and_no_room_is_a_500(tmp_path: Path) -> None:
    """One worker, --models-max 1: while `one` streams, a request for `two` gets llama-server's
    500 "model limit reached, try again later" at once (a model that is serving is never
    evicted); once `one` is idle, `two` loads in its place."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("one", "two"):
        write_tiny_llama(models / f"{name}.gguf")
    redis_process, redis_url = start_redis(tmp_path / "redis")
    fleet = Fleet(redis_url, tmp_path, ["--store-url", str(tmp_path / "store")],
                  logs=tmp_path / "logs")
    try:
        fleet.add_worker("-c", "8192", "-np", "1", "-t", "1", "--no-warmup")
        url = fleet.add_api("--models-dir", str(models), "--models-max", "1")
        first = httpx.post(f"{url}/completion", json={"model": "one", "prompt": "a",
                                                       "n_predict": 2}, timeout=LOAD_S)
        assert first.status_code == 200, first.text
        long = {"model": "one", "prompt": "a", "n_predict": 8000, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{url}/completion", json=long, timeout=LOAD_S) as stream:
            lines = stream.iter_lines()
            while '"content"' not in next(lines):
                pass  # `one` is generating now
            started = time.monotonic()
            response = httpx.post(f"{url}/completion", json={"model": "two", "prompt": "a"},
                                  timeout=LOAD_S)
            error(response, 500, "model limit reached, try again later", "server_error")
            assert time.monotonic() - started < 10
        wait_until(lambda: httpx.get(f"{url}/slots?model=one").json()[0]["is_processing"]
                   is False, 60, what="one idle")
        second = httpx.post(f"{url}/completion", json={"model": "two", "prompt": "a",
                                                        "n_predict": 2}, timeout=LOAD_S)
        assert second.status_code == 200, second.text
        assert status(url, "one") == {"value": "unloaded"}
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()


async def test_loads_wait_in_line_first_in_first_out(redis_url: str) -> None:
    """Requests waiting for different models to load are placed in the order they came."""
    from scheduler.connections import open_redis
    from scheduler.fleet_models import FleetModels

    redis = open_redis(redis_url)
    try:
        models = FleetModels(redis)
        await models.leave_line("early")
        await models.leave_line("late")
        assert await models.wait_in_line("early", 60)
        assert not await models.wait_in_line("late", 60)  # behind early
        assert await models.wait_in_line("early", 60)  # still first: its time is kept
        await models.leave_line("early")  # loaded (or failed, or gave up)
        assert await models.wait_in_line("late", 60)
        await models.leave_line("late")
    finally:
        await redis.aclose()
