"""Open the object store a URL names (`LLAMAQ_STORE_URL`)."""

from pathlib import Path

from storage.base import ObjectStore
from storage.errors import InvalidKey
from storage.local import LocalStore


def open_store(url: str, s3_endpoint_url: str | None = None) -> ObjectStore:
    """`s3://bucket/prefix` → S3Store; a folder path, `~/…` or `file://path` → LocalStore."""
    if url.startswith("s3://"):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise InvalidKey(f"store URL {url!r} names no bucket")
        from storage.s3 import S3Store  # boto3 (~25 MB) only where a store is in S3

        return S3Store(bucket, prefix, s3_endpoint_url)
    folder = url.removeprefix("file://")
    if not folder:
        raise InvalidKey("store URL is empty")
    return LocalStore(Path(folder).expanduser())
