"""One object named by a URL: a path on this machine or `s3://bucket/key` (a settings file
kept in the object store, e.g. --tenants)."""

from pathlib import Path

from storage.errors import InvalidKey


def read_object_url(url: str, s3_endpoint_url: str | None = None) -> bytes:
    """The bytes of `url`: `s3://bucket/key` from S3 (ObjectNotFound when missing), else a
    local file (OSError when unreadable)."""
    if url.startswith("s3://"):
        bucket, _, key = url.removeprefix("s3://").partition("/")
        if not bucket or not key:
            raise InvalidKey(f"{url!r} names no bucket and key")
        from storage.s3 import S3Store  # boto3 only where it is needed

        return S3Store(bucket, "", s3_endpoint_url).get_bytes(key)
    return Path(url.removeprefix("file://")).expanduser().read_bytes()
