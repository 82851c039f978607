"""Settings of model sources: -mu, LLAMA_CACHE over LLAMAQ_CACHE_DIR; `llamaq models push`."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from storage import ChecksumMismatch, LocalStore, ModelFiles
from storage.checksum import checksum_key
from worker.runtime.settings import WorkerSettings


def test_llama_cache_wins_over_llamaq_cache_dir() -> None:
    env = {"LLAMAQ_CACHE_DIR": "/ours", "LLAMA_CACHE": "/spec"}
    assert WorkerSettings.from_args([], env).model_cache_dir() == Path("/spec")
    assert WorkerSettings.from_args([], {"LLAMAQ_CACHE_DIR": "/ours"}).model_cache_dir() == \
        Path("/ours")
    flag = WorkerSettings.from_args(["--cache-dir", "/flag"], env)
    assert flag.model_cache_dir() == Path("/flag")  # a flag beats every variable
    assert WorkerSettings.from_args(["--cache-dir=/flag"], env).cache_dir == "/flag"


def test_model_url_flag_and_name() -> None:
    url = "http://127.0.0.1:1/files/some-model-Q4_K_M.gguf?download=1"
    settings = WorkerSettings.from_args(["-mu", url], {})
    assert settings.model_url == url
    assert settings.model_id() == "some-model-Q4_K_M.gguf"
    assert WorkerSettings.from_args([], {"LLAMA_ARG_MODEL_URL": url}).model_url == url
    assert WorkerSettings.from_args(["--model-url", url, "-a", "mine"], {}).model_id() == "mine"


def gguf_file(tmp_path: Path) -> Path:
    path = tmp_path / "pushed.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    return path


@pytest.mark.process
def test_models_push_uploads_with_checksum(tmp_path: Path) -> None:
    model = gguf_file(tmp_path)
    store_dir = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-m", "llamaq", "models", "push", str(model), "--name", "team/m.gguf",
         "--store-url", str(store_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert f"models/team/m.gguf sha256:{digest}" in done.stdout
    store = LocalStore(store_dir)
    assert store.get_bytes(checksum_key("models/team/m.gguf")).decode().strip() == digest
    files = ModelFiles(store, tmp_path / "cache")  # what a worker's -m team/m.gguf does
    assert files.resolve("team/m.gguf").read_bytes() == model.read_bytes()
    store.put_bytes("models/team/m.gguf", b"GGUF-tampered")
    with pytest.raises(ChecksumMismatch):
        ModelFiles(store, tmp_path / "other-cache").resolve("team/m.gguf")


@pytest.mark.process
def test_models_push_refuses_what_is_not_a_gguf(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    done = subprocess.run([sys.executable, "-m", "llamaq", "models", "push", str(text),
                           "--store-url", str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "not a GGUF file" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "llamaq", "models", "push",
                              str(tmp_path / "absent.gguf")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode != 0 and "no such file" in missing.stderr


def test_incomplete_sidecars() -> None:
    from scheduler.downloads import DownloadStatus, incomplete_sidecars

    paused = DownloadStatus(value="incomplete", sidecars=["mmproj", "mtp"])
    assert incomplete_sidecars(paused, ("mmproj",)) == ["mtp"]
    assert incomplete_sidecars(paused, ("mmproj", "mtp")) == []
    running = DownloadStatus(value="downloading", sidecars=["mtp"])
    assert incomplete_sidecars(running, ()) == [] and incomplete_sidecars(None, ()) == []
    assert running.to_wire() == {"value": "downloading", "progress": {}}
