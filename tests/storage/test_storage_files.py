"""Uploaded files and batch result chunks, on a folder and on a real S3 endpoint (moto)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import ObjectNotFound, ObjectStore
from storage.errors import StorageError
from storage.files import ChunkResult, ChunkStore, FileStore, StoredFile


def meta(file_id: str, size: int) -> StoredFile:
    return StoredFile(id=file_id, bytes=size, created_at=1, filename="in.jsonl",
                      purpose="batch")


def test_files_round_trip_and_delete(store: ObjectStore, tmp_path: Path) -> None:
    files = FileStore(store)
    files.put(meta("file-a", 3), b"abc")
    source = tmp_path / "big.jsonl"
    source.write_bytes(b"x\n" * 1000)
    files.put_path(meta("file-b", 2000), source)
    assert files.meta("file-a").bytes == 3 and files.content("file-a") == b"abc"
    assert files.content("file-b") == source.read_bytes()
    assert sorted(f.id for f in files.list()) == ["file-a", "file-b"]
    files.delete("file-a")
    with pytest.raises(ObjectNotFound):
        files.meta("file-a")
    with pytest.raises(ObjectNotFound):
        files.content("file-a")
    with pytest.raises(ObjectNotFound):
        files.meta("../slots/x")  # not an id we could have minted: simply not there
    assert [f.id for f in files.list()] == ["file-b"]


def test_a_chunk_run_again_replaces_its_object(store: ObjectStore) -> None:
    chunks = ChunkStore(store)
    chunks.put("batch_x", 1, ChunkResult(output=['{"a":1}'], errors=['{"e":1}']))
    chunks.put("batch_x", 1, ChunkResult(output=['{"a":2}', '{"a":3}'], errors=[]))
    chunks.put("batch_x", 0, ChunkResult(output=[], errors=['{"e":0}']))
    assert chunks.indexes("batch_x") == [0, 1]
    assert chunks.get("batch_x", 1) == ChunkResult(output=['{"a":2}', '{"a":3}'], errors=[])
    assert chunks.get("batch_x", 0).errors == ['{"e":0}']
    chunks.delete_all("batch_x")
    assert chunks.indexes("batch_x") == []


def test_a_truncated_chunk_is_an_error(store: ObjectStore) -> None:
    store.put_bytes("batches/batch_y/chunk-000000", b'{"output": 2, "errors": 0}\n{"a":1}\n')
    with pytest.raises(StorageError, match="truncated"):
        ChunkStore(store).get("batch_y", 0)
