"""A slot saved on one worker restores on another, through a real S3 endpoint (moto)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from moto.server import ThreadedMotoServer

from tests.conftest import make_fleet
from tests.processes import free_port, wait_until


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)  # the worker processes inherit them
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_save_on_one_worker_restore_on_another(redis_url: str, workdir: Path, gemma_path: Path,
                                                s3_endpoint: str) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-snap")
    flags = ("-c", "2048", "-np", "1", "-t", "1", "--slot-save-path", "s3://snapshots/slots",
             "--s3-endpoint-url", s3_endpoint)
    try:
        fleet.add_worker(*flags)
        api = fleet.add_api()
        fleet.wait_healthy(api)
        fleet.add_worker(*flags)
        wait_until(lambda: len(httpx.get(f"{api}/slots").json()) == 2, what="two slots")

        prompt = "The old lighthouse keeper climbed the stairs every night to " * 4
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0}
        first = httpx.post(f"{api}/completion", json={**body, "id_slot": 0}, timeout=60).json()
        saved = httpx.post(f"{api}/slots/0?action=save", json={"filename": "keeper.bin"},
                           timeout=60).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "keeper.bin"
        assert saved["n_saved"] == first["tokens_cached"] and saved["n_written"] > 0
        assert saved["timings"]["save_ms"] > 0

        restored = httpx.post(f"{api}/slots/1?action=restore", json={"filename": "keeper.bin"},
                              timeout=60).json()
        assert restored["n_restored"] == saved["n_saved"]
        assert restored["n_read"] == saved["n_written"]
        again = httpx.post(f"{api}/completion", json={**body, "id_slot": 1}, timeout=60).json()
        assert again["id_slot"] == 1
        assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1  # the whole prompt
        assert again["content"] == first["content"]

        erased = httpx.post(f"{api}/slots/1?action=erase", timeout=60).json()
        assert erased == {"id_slot": 1, "n_erased": again["tokens_cached"]}
        cold = httpx.post(f"{api}/completion", json={**body, "id_slot": 1}, timeout=60).json()
        assert cold["timings"]["cache_n"] == 0

        missing = httpx.post(f"{api}/slots/1?action=restore", json={"filename": "nope.bin"})
        assert missing.status_code == 400
        for url, payload in ((f"{api}/slots/0?action=save", {"filename": "../x"}),
                             (f"{api}/slots/0?action=fly", {"filename": "x"}),
                             (f"{api}/slots/zero?action=save", {"filename": "x"})):
            assert httpx.post(url, json=payload).status_code == 400
    finally:
        fleet.stop()


def test_slot_actions_need_slot_save_path(api: str) -> None:
    response = httpx.post(f"{api}/slots/0?action=save", json={"filename": "x.bin"})
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"
