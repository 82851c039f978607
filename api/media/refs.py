"""A request's media as a job's MediaRefs (scheduler/contract/media.py): small ones inline,
larger ones put in the object store once by content hash (storage/media.py)."""

from __future__ import annotations

import asyncio

from api.media.sources import MediaAccess, media_bytes
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


async def media_refs(sources: list[str], access: MediaAccess,
                     store: ObjectStore) -> list[MediaRef]:
    """Each source (a URL, data URI or base64) read and made a MediaRef, in order."""
    if len(sources) > MAX_MEDIA_ITEMS:
        raise InvalidRequest(f"too many media items: {len(sources)} (at most {MAX_MEDIA_ITEMS})")
    return await refs_of([await media_bytes(s, access) for s in sources], store)


async def refs_of(items: list[bytes], store: ObjectStore) -> list[MediaRef]:
    """Inline while the job's inline bytes stay within MEDIA_INLINE_MAX (all its media
    together), the rest through the store."""
    refs = []
    inline_left = MEDIA_INLINE_MAX
    for data in items:
        refs.append(await ref_of(data, store, inline_left))
        if refs[-1].data is not None:
            inline_left -= len(data)
    return refs


async def ref_of(data: bytes, store: ObjectStore,
                 inline_left: int = MEDIA_INLINE_MAX) -> MediaRef:
    if len(data) > MAX_MEDIA_BYTES:
        raise InvalidRequest(f"a media item is larger than {MAX_MEDIA_BYTES} bytes")
    if len(data) <= inline_left:
        return MediaRef.inline(data)
    key = await asyncio.to_thread(MediaStore(store).put, data)
    return MediaRef(sha256=sha256_hex(data), size=len(data), store_key=key)
