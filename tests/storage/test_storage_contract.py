"""The ObjectStore contract, run against LocalStore and S3Store (real moto server)."""

import os
from pathlib import Path

import pytest

from storage import InvalidKey, ObjectNotFound, ObjectStore


def test_is_an_object_store(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert store.describe()


def test_bytes_round_trip_and_overwrite(store: ObjectStore) -> None:
    store.put_bytes("a/b/c.bin", b"\x00first")
    assert store.get_bytes("a/b/c.bin") == b"\x00first"
    store.put_bytes("a/b/c.bin", b"second")
    assert store.get_bytes("a/b/c.bin") == b"second"
    assert store.size("a/b/c.bin") == 6
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""


def test_missing_key(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound):
        store.get_bytes("nope/missing")
    with pytest.raises(ObjectNotFound):
        store.size("nope/missing")
    with pytest.raises(ObjectNotFound):
        store.get_file("nope/missing", tmp_path / "out" / "f")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    assert not store.exists("nope/missing")


def test_file_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    data = os.urandom(9 * 1024 * 1024)  # above boto3's multipart threshold
    source.write_bytes(data)
    store.put_file("models/big.gguf", source)
    assert store.size("models/big.gguf") == len(data)

    dest = tmp_path / "deep" / "dir" / "big.gguf"
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"old content")
    store.get_file("models/big.gguf", dest)
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["big.gguf"]  # no temp file left behind


def test_get_file_creates_parent_folders(store: ObjectStore, tmp_path: Path) -> None:
    store.put_bytes("k", b"v")
    store.get_file("k", tmp_path / "x" / "y" / "k")
    assert (tmp_path / "x" / "y" / "k").read_bytes() == b"v"


def test_exists_and_delete(store: ObjectStore) -> None:
    store.put_bytes("d/one", b"1")
    assert store.exists("d/one")
    store.delete("d/one")
    assert not store.exists("d/one")
    store.delete("d/one")  # absent: no error
    store.delete("never/was")


def test_list_by_prefix(store: ObjectStore) -> None:
    for key in ("models/a.gguf", "models/sub/b.gguf", "modelsx", "slots/s1", "top"):
        store.put_bytes(key, b"x")
    assert store.list_keys("models/") == ["models/a.gguf", "models/sub/b.gguf"]
    assert store.list_keys("models") == ["models/a.gguf", "models/sub/b.gguf", "modelsx"]
    assert store.list_keys("models/sub/b") == ["models/sub/b.gguf"]
    assert store.list_keys("") == [
        "models/a.gguf",
        "models/sub/b.gguf",
        "modelsx",
        "slots/s1",
        "top",
    ]
    assert store.list_keys("absent/") == []


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "../x", "a//b", "a/./b", "dir/"])
def test_invalid_keys(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put_bytes(key, b"x")
    with pytest.raises(ValueError):
        store.get_bytes(key)
    with pytest.raises(InvalidKey):
        store.exists(key)


@pytest.mark.parametrize("prefix", ["/abs", "../", "a/../"])
def test_invalid_prefixes(store: ObjectStore, prefix: str) -> None:
    with pytest.raises(InvalidKey):
        store.list_keys(prefix)
