"""Media on the api side (api/media/): the sources llama-server reads (data URIs, base64,
`file://` under --media-path) with its errors, and which media ride in the job and which go
through the object store by content hash."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path

import pytest

from api.media.refs import refs_of
from api.media.sources import MediaAccess, data_uri, decode_base64, local_file, media_bytes
from api.net.policy import FetchPolicy
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.media import MEDIA_INLINE_MAX
from storage.local import LocalStore
from storage.media import MediaStore


def test_data_uris_as_llama_server_reads_them() -> None:
    assert data_uri("data:image/png;base64," + base64.b64encode(b"png!").decode()) == b"png!"
    assert data_uri("data:audio/wav;base64,AAAA") == b"\x00\x00\x00"
    for uri, message in [("data:image/png;base64,AA,BB", "Invalid uri-encoded base64 value"),
                         ("data:text/plain;base64,AA",
                          "Invalid uri format: data:text/plain;base64"),
                         ("data:image/png,AAAA", "uri must be base64 encoded")]:
        with pytest.raises(InvalidRequest, match=message):
            data_uri(uri)
    assert decode_base64("aGk") == b"hi"  # missing padding is forgiven
    with pytest.raises(InvalidRequest, match="Invalid base64 value"):
        asyncio.run(media_bytes("!!!", MediaAccess(None, FetchPolicy())))


def test_file_urls_stay_in_the_media_folder(tmp_path: Path) -> None:
    root = tmp_path / "media"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(b"x")
    (tmp_path / "outside.png").write_bytes(b"secret")
    (root / "link.png").symlink_to(tmp_path / "outside.png")
    assert local_file("a/x.png", str(root)) == b"x"
    with pytest.raises(InvalidRequest, match="not allowed unless --media-path"):
        local_file("a/x.png", None)
    for bad in ("../outside.png", "/etc/passwd", "a/../../outside.png", "link.png", ""):
        with pytest.raises(InvalidRequest, match="file path is not allowed"):
            local_file(bad, str(root))
    with pytest.raises(InvalidRequest, match="file does not exist or cannot be opened: a/y"):
        local_file("a/y", str(root))


def test_small_media_ride_in_the_job_and_the_rest_go_through_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    small, big = b"s" * 1000, b"b" * (MEDIA_INLINE_MAX + 1)
    fill = b"f" * (MEDIA_INLINE_MAX - 500)
    refs = asyncio.run(refs_of([small, big, fill, small], store))
    assert [r.data is not None for r in refs] == [True, False, False, True]
    assert base64.b64decode(refs[0].data or "") == small
    assert refs[1].store_key == "media/" + hashlib.sha256(big).hexdigest()
    assert MediaStore(store).get(refs[1].store_key, refs[1].sha256) == big
    assert refs[2].store_key is not None  # over what is left of the job's inline budget
