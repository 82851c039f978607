"""LocalStore specifics and the open_store factory."""

import os
from pathlib import Path

import pytest

from storage import InvalidKey, LocalStore, open_store
from storage.s3 import S3Store


def test_creates_root_and_hides_staging(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "new" / "root")
    store.put_bytes("a/b", b"data")
    assert (tmp_path / "new" / "root" / "a" / "b").read_bytes() == b"data"
    assert store.list_keys() == ["a/b"]
    assert os.listdir(tmp_path / "new" / "root" / ".staging") == []  # temp files renamed away
    with pytest.raises(InvalidKey):
        store.put_bytes(".staging/x", b"x")


def test_directory_is_not_an_object(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("dir/file", b"x")
    assert not store.exists("dir")
    store.delete("dir")  # a folder, not an object: nothing to delete
    assert store.exists("dir/file")


def test_open_store_folder_variants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for url, expected in (
        (str(tmp_path / "plain"), tmp_path / "plain"),
        ("~/home-store", tmp_path / "home-store"),
        (f"file://{tmp_path / 'url-store'}", tmp_path / "url-store"),
    ):
        store = open_store(url)
        assert isinstance(store, LocalStore)
        assert store.root == expected.resolve()
        assert expected.is_dir()
    with pytest.raises(InvalidKey):
        open_store("")


def test_open_store_s3(moto_endpoint: str, aws_env: None) -> None:
    store = open_store("s3://factory-bucket/some/prefix/", s3_endpoint_url=moto_endpoint)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == ("factory-bucket", "some/prefix/")
    store.put_bytes("k", b"v")
    assert store.get_bytes("k") == b"v"
    with pytest.raises(InvalidKey):
        open_store("s3:///prefix-only")
