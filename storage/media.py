"""Media bytes in the object store by content hash (`media/<sha256>`): the api puts a large
image or audio file once, every worker that needs it reads it by key."""

from __future__ import annotations

import hashlib

from storage.base import ObjectStore
from storage.errors import StorageError

MEDIA_PREFIX = "media/"


class MediaStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def put(self, data: bytes) -> str:
        """Store `data` (once: the key is its hash); returns its key."""
        key = MEDIA_PREFIX + hashlib.sha256(data).hexdigest()
        if not self.store.exists(key):
            self.store.put_bytes(key, data)
        return key

    def get(self, key: str, sha256: str) -> bytes:
        if key != MEDIA_PREFIX + sha256:
            raise StorageError(f"not a media key: {key!r}")
        data = self.store.get_bytes(key)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise StorageError(f"media {key} does not match its hash")
        return data
