"""A job's media bytes: inline (base64 in the job) or from the object store by content hash
(storage/media.py), kept in a small cache by hash so a repeated image is read once."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections import OrderedDict

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.media import MediaRef, sha256_hex
from storage import open_store
from storage.media import MediaStore

CACHE_BYTES = 64 << 20
"""Media bytes a worker keeps by hash (least recently used out first)."""


class MediaFetcher:
    def __init__(self, store_url: str, s3_endpoint_url: str | None) -> None:
        self._store_url = store_url
        self._s3 = s3_endpoint_url
        self._store: MediaStore | None = None
        self._cache: OrderedDict[str, bytes] = OrderedDict()

    async def fetch(self, refs: list[MediaRef]) -> list[bytes]:
        return [await self._one(ref) for ref in refs]

    async def _one(self, ref: MediaRef) -> bytes:
        cached = self._cache.get(ref.sha256)
        if cached is not None:
            self._cache.move_to_end(ref.sha256)
            return cached
        if ref.data is not None:
            try:
                data = base64.b64decode(ref.data, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("Invalid base64 value") from None
            if sha256_hex(data) != ref.sha256:
                raise InvalidRequest("media bytes do not match their hash")
        elif ref.store_key is not None:
            data = await asyncio.to_thread(self._media_store().get, ref.store_key, ref.sha256)
        else:
            raise InvalidRequest("a media item needs its data or its store key")
        self._keep(ref.sha256, data)
        return data

    def _media_store(self) -> MediaStore:
        if self._store is None:
            self._store = MediaStore(open_store(self._store_url, self._s3))
        return self._store

    def _keep(self, sha256: str, data: bytes) -> None:
        self._cache[sha256] = data
        while sum(len(v) for v in self._cache.values()) > CACHE_BYTES and len(self._cache) > 1:
            self._cache.popitem(last=False)
