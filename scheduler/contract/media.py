"""Media (images, audio) on a job: what the api hands the worker for each media marker of a
prompt, and how the bytes travel.

Small media ride inside the job (base64); media over MEDIA_INLINE_MAX bytes go to the object
store under their SHA-256 (storage/media.py) and the job carries the key, so Redis messages
stay small. The worker decodes the bytes with the model's projector (worker/runtime/media.py)."""

from __future__ import annotations

import base64
import hashlib

from scheduler.contract.deferred import DeferredModel

MEDIA_INLINE_MAX = 256 << 10
"""A job's media travel inside it up to this many bytes in all; the others through the object
store (by content hash)."""
MAX_MEDIA_BYTES = 20 << 20
"""One image or audio file: at most this many bytes (llamaq's limit; llama-server has none for
data URIs and 10 MiB for a download)."""
MAX_MEDIA_DOWNLOAD_BYTES = 10 << 20
"""An http(s) image URL: llama-server's 10 MiB download limit."""
MAX_MEDIA_ITEMS = 32
"""Media items in one request (llamaq's limit)."""


class MediaRef(DeferredModel):
    """One media file of a job, in the order of the prompt's markers."""

    sha256: str
    size: int
    data: str | None = None
    """The bytes, base64 (small media)."""
    store_key: str | None = None
    """Where the bytes are in the object store (large media)."""

    @classmethod
    def inline(cls, raw: bytes) -> MediaRef:
        return cls(sha256=sha256_hex(raw), size=len(raw),
                   data=base64.b64encode(raw).decode("ascii"))


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
