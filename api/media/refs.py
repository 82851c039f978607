"""A request's media as a job's MediaRefs (scheduler/contract/media.py): small ones inline,
larger ones put in the object store once by content hash (storage/media.py)."""

from __future__ import annotations

import asyncio

from api.media.sources import media_bytes
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.media import (
    MAX_MEDIA_BYTES,
    MAX_MEDIA_ITEMS,
    MEDIA_INLINE_MAX,
    MediaRef,
    sha256_hex,
)
from storage.base import ObjectStore
from storage.media import MediaStore


async def media_refs(sources: list[str], media_path: str | None,
                     store: ObjectStore) -> list[MediaRef]:
    """Each source (a URL, data URI or base64) read and made a MediaRef, in order."""
    if len(sources) > MAX_MEDIA_ITEMS:
        raise InvalidRequest(f"too many media items: {len(sources)} (at most {MAX_MEDIA_ITEMS})")
    return [await ref_of(await media_bytes(s, media_path), store) for s in sources]


async def ref_of(data: bytes, store: ObjectStore) -> MediaRef:
    if len(data) > MAX_MEDIA_BYTES:
        raise InvalidRequest(f"a media item is larger than {MAX_MEDIA_BYTES} bytes")
    if len(data) <= MEDIA_INLINE_MAX:
        return MediaRef.inline(data)
    key = await asyncio.to_thread(MediaStore(store).put, data)
    return MediaRef(sha256=sha256_hex(data), size=len(data), store_key=key)
