"""A store opened on first use: a process that may never touch the store (an api pod that
serves no batch) must not fail to start because its folder cannot be made or S3 is away."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from storage.base import ObjectStore


class LazyStore:
    def __init__(self, opener: Callable[[], ObjectStore]) -> None:
        self._opener = opener
        self._store: ObjectStore | None = None
        self._lock = threading.Lock()

    def _get(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                self._store = self._opener()
            return self._store

    def put_bytes(self, key: str, data: bytes) -> None:
        self._get().put_bytes(key, data)

    def get_bytes(self, key: str) -> bytes:
        return self._get().get_bytes(key)

    def put_file(self, key: str, path: Path) -> None:
        self._get().put_file(key, path)

    def get_file(self, key: str, path: Path,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        self._get().get_file(key, path, on_bytes)

    def exists(self, key: str) -> bool:
        return self._get().exists(key)

    def size(self, key: str) -> int:
        return self._get().size(key)

    def delete(self, key: str) -> None:
        self._get().delete(key)

    def list_keys(self, prefix: str = "") -> list[str]:
        return self._get().list_keys(prefix)

    def describe(self) -> str:
        return "not opened yet" if self._store is None else self._store.describe()
