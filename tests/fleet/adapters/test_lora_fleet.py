"""LoRA adapters on a real fleet: two workers started with --lora (the adapter of
tests/tiny_lora.py), one api, real Redis, httpx. `GET /lora-adapters` from the registry,
`POST /lora-adapters` setting the global scales on every worker of the model (a request after
the answer gets them, whichever worker runs it), a worker that joins later taking the stored
scales, llama-server's errors and the `lora` of generation_settings and /props."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from scheduler.contract import keys
from storage import open_store
from storage.checksum import sha256_file
from tests.conftest import make_fleet
from tests.paths import DATA
from tests.processes import Fleet, wait_until
from tests.tiny_lora import write_lora

WORKER = ("-c", "1024", "-np", "2", "-t", "1", "--swa-full")  # as the reference was made
EXPECTED = json.loads((DATA / "lora_greedy.json").read_text())
PROMPT = EXPECTED["cases"][0]["prompt"]


def expected_tokens(scale: float) -> list[int]:
    return next(c["tokens"] for c in EXPECTED["cases"]
                if c["prompt"] == PROMPT and c["scale"] == scale)


@pytest.fixture(scope="module")
def lora_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(tmp_path_factory.mktemp("lora") / "lora.gguf", seed=EXPECTED["seed"],
                      task_name="tiny-task")


@pytest.fixture(scope="module")
def lora_fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory, gemma_path: Path,
               lora_path: Path) -> Iterator[Fleet]:
    fleet = make_fleet(redis_url, tmp_path_factory.mktemp("lora-fleet"), gemma_path,
                       "gemma-lora")
    for _ in range(2):
        fleet.add_worker(*WORKER, "--lora", str(lora_path))
    url = fleet.add_api()
    wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots") == 4, 120,
               what="two workers")
    yield fleet
    fleet.stop()


@pytest.fixture
def api(lora_fleet: Fleet) -> Iterator[str]:
    url = lora_fleet.api_urls[0]
    yield url
    httpx.post(f"{url}/lora-adapters", json=[{"id": 0, "scale": 1.0}])  # the flags' scale


def greedy(api: str) -> list[list[int]]:
    """A greedy completion on each worker, one after the other (slot 0 is the first worker's,
    slot 2 the second's; alone in its step, as the stored expectation ran)."""
    body = {"prompt": PROMPT, "n_predict": EXPECTED["n_predict"], "temperature": 0,
            "return_tokens": True, "cache_prompt": False}
    tokens = []
    for id_slot in (0, 2):
        response = httpx.post(f"{api}/completion", json={**body, "id_slot": id_slot},
                              timeout=120)
        assert response.status_code == 200, response.text
        tokens.append(response.json()["tokens"])
    return tokens


def test_get_lists_the_adapter_as_llama_server_does(api: str, lora_path: Path) -> None:
    response = httpx.get(f"{api}/lora-adapters")
    assert response.status_code == 200
    assert response.json() == [{"id": 0, "path": str(lora_path), "scale": 1.0,
                                "task_name": "tiny-task", "prompt_prefix": ""}]


def test_post_sets_the_global_scale_on_every_worker(api: str) -> None:
    """llama-server's greedy tokens under the adapter (scale 1, the flag), then after
    POST [] (every adapter at 0) the base model's on both workers, then
    the adapter's again after POST [{id 0, scale 1}]."""
    assert greedy(api) == [expected_tokens(1.0)] * 2
    response = httpx.post(f"{api}/lora-adapters", json=[])
    assert response.status_code == 200 and response.json() == {"success": True}
    assert httpx.get(f"{api}/lora-adapters").json()[0]["scale"] == 0.0
    assert greedy(api) == [expected_tokens(0.0)] * 2
    assert httpx.post(f"{api}/lora-adapters",
                      json=[{"id": 0, "scale": 1}, {"id": 7, "scale": 3}]).json() == \
        {"success": True}  # an unknown id is ignored, as llama-server does
    assert httpx.get(f"{api}/lora-adapters").json()[0]["scale"] == 1.0
    assert greedy(api) == [expected_tokens(1.0)] * 2


def test_unknown_ids_turn_every_adapter_off(api: str) -> None:
    assert httpx.post(f"{api}/lora-adapters", json=[{"id": 99, "scale": 1}]).status_code == 200
    assert [a["scale"] for a in httpx.get(f"{api}/lora-adapters").json()] == [0.0]


@pytest.mark.parametrize("body", [{"id": 0, "scale": 1}, "x", 3, None])
def test_a_body_that_is_not_an_array_is_a_400(api: str, body: object) -> None:
    content = b"" if body is None else json.dumps(body).encode()
    response = httpx.post(f"{api}/lora-adapters", content=content)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": 400, "message": "Request body must be an array",
                                        "type": "invalid_request_error"}


def test_generation_settings_and_props_show_the_requests_lora(api: str) -> None:
    """The request's own list (none here), not the global scales, as llama-server shows it."""
    body = httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 2}).json()
    assert body["generation_settings"]["lora"] == []
    props = httpx.get(f"{api}/props").json()
    assert props["default_generation_settings"]["params"]["lora"] == []


def test_a_worker_that_joins_later_takes_the_stored_scales(
        api: str, lora_fleet: Fleet, lora_path: Path, redis_url: str) -> None:
    assert httpx.post(f"{api}/lora-adapters", json=[{"id": 0, "scale": 0.25}]).status_code == 200
    lora_fleet.add_worker(*WORKER, "--lora", str(lora_path), "--worker-id", "lora-late")
    client = redis.Redis.from_url(redis_url)

    def late_entry() -> dict[str, object] | None:
        body = client.get(keys.worker_info("lora-late"))
        return None if body is None else json.loads(body)  # type: ignore[arg-type]

    wait_until(lambda: late_entry() is not None, 120, what="the late worker")
    entry = late_entry()
    assert entry is not None
    assert [a["scale"] for a in entry["lora"]] == [0.25]  # type: ignore[attr-defined]
    lora_fleet.stop_process(lora_fleet.processes[-1])


def test_a_requests_lora_overrides_the_global_scales(api: str) -> None:
    """Under the global scale 1: a request's `lora` [{id 0, scale 0.5}] gets llama-server's
    tokens for 0.5 and shows its own list in generation_settings; [{id 99}] names no loaded
    adapter, so every adapter is off for it (the base model's tokens), as llama-server does."""
    body = {"prompt": PROMPT, "n_predict": EXPECTED["n_predict"], "temperature": 0,
            "return_tokens": True, "cache_prompt": False}
    half = httpx.post(f"{api}/completion", timeout=120,
                      json={**body, "lora": [{"id": 0, "scale": 0.5}]}).json()
    assert half["tokens"] == expected_tokens(0.5)
    assert half["generation_settings"]["lora"] == [{"id": 0, "scale": 0.5}]
    off = httpx.post(f"{api}/completion", timeout=120,
                     json={**body, "lora": [{"id": 99, "scale": 1}]}).json()
    assert off["tokens"] == expected_tokens(0.0)
    bad = httpx.post(f"{api}/completion", json={**body, "lora": {"id": 0}})
    assert bad.status_code == 400 and "'lora' must be an array" in bad.json()["error"]["message"]


def test_adapter_files_come_from_the_store_checked_by_sha256(
        redis_url: str, tmp_path: Path, gemma_path: Path, lora_path: Path) -> None:
    """`--lora KEY` names a store object (as `-m` does): the worker fetches it into its
    machine's cache, checked against the store's SHA-256, and lists it by the name it was
    given; a store copy whose recorded SHA-256 differs stops the worker, naming the checksum."""
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "gemma-lora-store")
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("models/lora-stored.gguf.sha256",
                    (sha256_file(lora_path) + "\n").encode())
    store.put_file("models/lora-stored.gguf", lora_path)
    store.put_bytes("models/lora-bad.gguf.sha256", (("0" * 64) + "\n").encode())
    store.put_file("models/lora-bad.gguf", lora_path)
    fleet.add_worker(*WORKER, "--worker-id", "lora-store", "--lora", "lora-stored.gguf")
    bad = fleet.add_worker(*WORKER, "--lora", "lora-bad.gguf")
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.get(keys.worker_info("lora-store")) is not None, 120,
                   what="the worker with the stored adapter")
        entry = json.loads(client.get(keys.worker_info("lora-store")))  # type: ignore[arg-type]
        assert [(a["path"], a["scale"]) for a in entry["lora"]] == [("lora-stored.gguf", 1.0)]
        cached = tmp_path / "cache" / "models" / "lora-stored.gguf"
        assert cached.read_bytes() == lora_path.read_bytes()
        assert bad.wait(timeout=120) != 0
        log = (fleet.logs / f"worker-{fleet.processes.index(bad)}.log").read_text()
        assert "checksum mismatch" in log
    finally:
        fleet.stop()


def test_a_worker_waking_from_idle_sleep_keeps_its_adapter_and_scales(
        redis_url: str, tmp_path: Path, gemma_path: Path, lora_path: Path) -> None:
    """--sleep-idle-seconds unloads the model with its adapters; the next request loads both
    again, under the global scale POST /lora-adapters set before (llama-server's tokens for
    it)."""
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "gemma-lora-sleep")
    fleet.add_worker(*WORKER, "--lora", str(lora_path), "--sleep-idle-seconds", "1")
    url = fleet.add_api()
    try:
        fleet.wait_healthy(url, timeout=120)
        assert httpx.post(f"{url}/lora-adapters", json=[{"id": 0, "scale": 0.5}]).json() == \
            {"success": True}
        wait_until(lambda: httpx.get(f"{url}/props").json()["is_sleeping"], 60,
                   what="the worker asleep")
        body = {"prompt": PROMPT, "n_predict": EXPECTED["n_predict"], "temperature": 0,
                "return_tokens": True, "cache_prompt": False}
        woken = httpx.post(f"{url}/completion", json=body, timeout=120).json()
        assert woken["tokens"] == expected_tokens(0.5)
        assert httpx.get(f"{url}/lora-adapters").json()[0]["scale"] == 0.5
    finally:
        fleet.stop()
