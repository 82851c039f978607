"""Restoring a slot fails as llama-server fails it: 400 "Unable to restore slot: …", for a
missing file, a file of another model and a damaged one (tiny GGUF, local object store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet


@pytest.fixture(scope="module")
def two_models(redis_url: str, workdir: Path, tiny_model_path: Path) -> Iterator[tuple[str, str]]:
    """The same weights served as two models that share one slot save path."""
    fleets = [make_fleet(redis_url, workdir, tiny_model_path, alias)
              for alias in ("tiny-snap-a", "tiny-snap-b")]
    urls = []
    try:
        for fleet in fleets:
            fleet.add_worker("-c", "512", "-np", "1", "-t", "1", "--slot-save-path",
                             str(workdir / "shared-slots"))
            urls.append(fleet.add_api())
        for fleet, url in zip(fleets, urls, strict=True):
            fleet.wait_healthy(url)
        yield urls[0], urls[1]
    finally:
        for fleet in fleets:
            fleet.stop()


def restore(api: str, filename: str) -> httpx.Response:
    return httpx.post(f"{api}/slots/0?action=restore", json={"filename": filename}, timeout=60)


def assert_unable(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("Unable to restore slot: ")


def test_a_missing_file(two_models: tuple[str, str]) -> None:
    assert_unable(restore(two_models[0], "never-saved.bin"))


def test_a_file_of_another_model(two_models: tuple[str, str]) -> None:
    a, b = two_models
    httpx.post(f"{a}/completion", json={"prompt": "hello world", "n_predict": 2}, timeout=60)
    saved = httpx.post(f"{a}/slots/0?action=save", json={"filename": "from-a.bin"}, timeout=60)
    assert saved.status_code == 200, saved.text
    assert restore(a, "from-a.bin").status_code == 200
    refused = restore(b, "from-a.bin")
    assert_unable(refused)
    assert "tiny-snap-a" in refused.json()["error"]["message"]


def test_damaged_metadata(two_models: tuple[str, str], workdir: Path) -> None:
    a, _ = two_models
    assert httpx.post(f"{a}/slots/0?action=save", json={"filename": "bent.bin"},
                      timeout=60).status_code == 200
    metas = list((workdir / "shared-slots").rglob("bent.bin.json"))
    assert len(metas) == 1
    metas[0].write_text('{"tokens": "not a list"}')
    assert_unable(restore(a, "bent.bin"))
    metas[0].write_text("not json")
    assert_unable(restore(a, "bent.bin"))
