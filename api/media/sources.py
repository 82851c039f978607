"""A media part's bytes from what the client sent, as llama-server's handle_media reads it:
an http(s) URL (downloaded here, on the api pod: the pod is the one that talks to the outside,
a worker may have no route out, and the bytes then travel by hash like any other media), a
`file://` path under --media-path, a base64 `data:` URI, or raw base64.

Errors are llama-server's: a failed download is a 500 "Failed to download image"; any
`file://` problem and a malformed data URI are 400s. **Ours** (issue 43): a URL is fetched only
from addresses the pod's FetchPolicy allows (api/net/: no private, loopback, link-local or
metadata address unless --fetch-allow lists it, checked after DNS and on every redirect), within
one deadline for the whole fetch, and every failure of a download (a refused address, no
answer, a non-2xx, too large, too slow) is the same error, so its answer tells nothing of the
pod's network; the reason is logged on the pod."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import dataclass
from pathlib import Path

from api.net.policy import AddressRefused, FetchPolicy
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest, ServerError
from scheduler.contract.media import MAX_MEDIA_BYTES, MAX_MEDIA_DOWNLOAD_BYTES

log = logging.getLogger(__name__)
DOWNLOAD_FAILED = "Failed to download image"


@dataclass(frozen=True)
class MediaAccess:
    """Where a request's media may come from: `path` (--media-path; None: no file:// URLs) and
    the addresses a URL may reach."""

    path: str | None
    fetch: FetchPolicy


def media_access(settings: ApiSettings, files: bool = True) -> MediaAccess:
    return MediaAccess(settings.media_path if files else None, settings.fetch_policy())


async def media_bytes(url: str, access: MediaAccess) -> bytes:
    if url.startswith("http"):
        return await download(url, access.fetch)
    if url.startswith("file://"):
        return await asyncio.to_thread(local_file, url.removeprefix("file://"), access.path)
    if url.startswith("data:"):
        return data_uri(url)
    data = decode_base64(url)
    if not data:
        raise InvalidRequest("Invalid base64 value")
    return data


class _DownloadFailed(Exception):
    pass


async def download(url: str, policy: FetchPolicy) -> bytes:
    """The body of `url` (2xx, at most MAX_MEDIA_DOWNLOAD_BYTES, within the policy's
    deadline), or the one ServerError of every failure."""
    # imported here, not at the top: httpx (with the click, pygments and rich its CLI loads)
    # costs an api pod ~30 ms of CPU at start, and only a fetch needs it
    import httpx

    try:
        async with asyncio.timeout(policy.deadline_s):
            return await _fetch(url, policy)
    except (TimeoutError, httpx.HTTPError, httpx.InvalidURL, ValueError, AddressRefused,
            _DownloadFailed) as exc:
        log.info("media download failed: %s: %s", type(exc).__name__, exc)
        raise ServerError(DOWNLOAD_FAILED) from None


async def _fetch(url: str, policy: FetchPolicy) -> bytes:
    from api.net.transport import guarded_client  # imports httpx: see download()

    async with guarded_client(policy, policy.deadline_s) as client, \
            client.stream("GET", url) as response:
        if not 200 <= response.status_code < 300:
            raise _DownloadFailed(f"status {response.status_code}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_MEDIA_DOWNLOAD_BYTES:
                raise _DownloadFailed(f"larger than {MAX_MEDIA_DOWNLOAD_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)


def local_file(relative: str, media_path: str | None) -> bytes:
    """A file under --media-path, by a relative path that stays inside it."""
    if not media_path:
        raise InvalidRequest("file:// URLs are not allowed unless --media-path is specified")
    root = Path(media_path).resolve()
    parts = Path(relative).parts
    if (not relative or Path(relative).is_absolute() or ".." in parts
            or any(ord(c) < 32 for c in relative) or "\\" in relative):
        raise InvalidRequest(f"file path is not allowed: {relative}")
    path = (root / relative).resolve()
    if not path.is_relative_to(root):  # a symlink out of the folder
        raise InvalidRequest(f"file path is not allowed: {relative}")
    try:
        if path.stat().st_size > MAX_MEDIA_BYTES:
            raise InvalidRequest(f"media file is larger than {MAX_MEDIA_BYTES} bytes: {relative}")
        return path.read_bytes()
    except OSError:
        raise InvalidRequest(f"file does not exist or cannot be opened: {relative}") from None


def data_uri(url: str) -> bytes:
    parts = url.split(",")
    if len(parts) != 2:
        raise InvalidRequest("Invalid uri-encoded base64 value")
    head, payload = parts
    if not head.startswith(("data:image/", "data:video/", "data:audio/")):
        raise InvalidRequest(f"Invalid uri format: {head}")
    if not head.endswith("base64"):
        raise InvalidRequest("uri must be base64 encoded")
    return decode_base64(payload)


def decode_base64(text: str) -> bytes:
    """Lenient as llama-server's decoder: stops at the first character outside the alphabet."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return b""
