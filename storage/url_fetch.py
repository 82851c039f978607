"""Plain HTTP(S) downloads (`-mu`, and the files the Hub serves): resumed from the partial file
a previous attempt left (`<target>.downloadInProgress`, llama.cpp's name), hashed on the way."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from storage.checksum import CHUNK
from storage.errors import DownloadCancelled, DownloadFailed
from storage.progress import DownloadListener

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".downloadInProgress"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0


def partial_path(target: Path) -> Path:
    return target.with_name(target.name + PARTIAL_SUFFIX)


def _hash_existing(path: Path) -> tuple[hashlib._Hash, int]:
    digest = hashlib.sha256()
    size = 0
    if path.is_file():
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
    return digest, size


def download_url(url: str, target: Path, listener: DownloadListener,
                 headers: dict[str, str] | None = None, source: str | None = None) -> str:
    """Download `url` to `target` (renamed into place once complete); returns its SHA-256.

    A partial file from an earlier attempt is continued with a Range request when the server
    takes one (206), else started again. DownloadCancelled when the listener asks to stop (the
    partial file stays for a resume), DownloadFailed on an HTTP or network error.
    """
    import httpx  # here: a worker that downloads nothing never loads it (~5 MiB, click, ...)

    source = source or url  # the name progress is reported under
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    digest, done = _hash_existing(partial)
    request_headers = dict(headers or {})
    if done:
        request_headers["Range"] = f"bytes={done}-"
        logger.info("resuming the download of %s at byte %d", target.name, done)
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    try:
        with httpx.stream("GET", url, headers=request_headers, timeout=timeout,
                          follow_redirects=True) as response:
            if response.status_code == 416 and done:  # nothing left past our bytes
                total = done
            else:
                if response.status_code not in (200, 206):
                    raise DownloadFailed(f"GET {_short(url)}: HTTP {response.status_code}")
                if response.status_code == 200 and done:  # the server ignored Range: restart
                    digest, done = hashlib.sha256(), 0
                total = _total(response, done)
                mode = "ab" if done else "wb"
                with partial.open(mode) as out:
                    listener.on_progress(source, done, total)
                    for chunk in response.iter_bytes():  # as received: a cut keeps them
                        out.write(chunk)
                        digest.update(chunk)
                        done += len(chunk)
                        listener.on_progress(source, done, total)
                        if listener.cancelled():
                            raise DownloadCancelled(f"download of {target.name} stopped at "
                                                    f"byte {done} on request")
        if total and done != total:
            raise DownloadFailed(f"GET {_short(url)}: got {done} of {total} bytes")
    except httpx.HTTPError as exc:
        raise DownloadFailed(f"GET {_short(url)}: {type(exc).__name__}: {exc}") from exc
    os.replace(partial, target)
    return digest.hexdigest()


def _total(response: httpx.Response, done: int) -> int:
    content_range = response.headers.get("Content-Range", "")
    if "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    return done + int(length) if length and length.isdigit() else 0


def _short(url: str) -> str:
    """The URL without its query (signed URLs carry credentials there)."""
    return url.split("?", 1)[0]
