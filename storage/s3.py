"""An object store in an S3 bucket (AWS, MinIO, moto) via boto3."""

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import Boto3Error
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from storage._fs import atomic_path
from storage.base import check_key, check_prefix
from storage.errors import ObjectNotFound, StorageError, StorageUnavailable

logger = logging.getLogger(__name__)

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})
_UNAVAILABLE_CODES = frozenset({"SlowDown", "ServiceUnavailable", "RequestTimeout"})


def make_s3_client(
    endpoint_url: str | None = None,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float = 60.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 S3 client (own session: thread-safe); path-style addressing for custom endpoints."""
    config = Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint_url else None,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def _storage_error(exc: BaseException, what: str) -> StorageError:
    """Map a boto3/botocore (or local OS) exception to our hierarchy."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _NOT_FOUND_CODES or status == 404:
            return ObjectNotFound(f"{what}: not found ({code})")
        if code in _UNAVAILABLE_CODES or status >= 500:
            return StorageUnavailable(f"{what}: {exc}")
        return StorageError(f"{what}: {exc}")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return StorageUnavailable(f"{what}: {exc}")
    if isinstance(exc, Boto3Error):  # transfer errors wrap the real one
        inner = getattr(exc, "last_exception", None) or exc.__cause__ or exc.__context__
        if inner is not None:
            return _storage_error(inner, what)
    return StorageError(f"{what}: {exc}")


class S3Store:
    """Objects are `<prefix>/<key>` in `bucket`; the bucket is created if missing."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        client: Any = None,
        *,
        create_bucket: bool = True,
    ) -> None:
        if not bucket:
            raise StorageError("S3 bucket name is empty")
        prefix = check_prefix(prefix.strip("/"))
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint_url = endpoint_url
        self._client = client if client is not None else make_s3_client(endpoint_url)
        if create_bucket:
            self.ensure_bucket()

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"

    def ensure_bucket(self) -> None:
        try:
            with self._translated("head bucket", ""):
                self._client.head_bucket(Bucket=self.bucket)
            return
        except ObjectNotFound:
            pass
        region = self._client.meta.region_name
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            with self._translated("create bucket", ""):
                self._client.create_bucket(**kwargs)
            logger.info("created the object store's bucket")
            logger.debug("created bucket %s", self.describe())
        except StorageError as exc:
            if not _is_code(exc.__cause__, "BucketAlreadyOwnedByYou"):
                raise

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._translated("write", key):
            self._client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data)

    def get_bytes(self, key: str) -> bytes:
        with self._translated("read", key):
            response = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            body: bytes = response["Body"].read()
        return body

    def put_file(self, key: str, path: Path) -> None:
        with self._translated("upload", key):
            self._client.upload_file(str(path), self.bucket, self._full(key))

    def get_file(self, key: str, path: Path,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        full = self._full(key)
        with self._translated("download", key), atomic_path(path) as tmp:
            self._client.download_file(self.bucket, full, str(tmp),
                                       Callback=_Counter(on_bytes) if on_bytes else None)

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        with self._translated("stat", key):
            response = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        return int(response["ContentLength"])

    def delete(self, key: str) -> None:
        with self._translated("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def list_keys(self, prefix: str = "") -> list[str]:
        full_prefix = self.prefix + check_prefix(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        keys: list[str] = []
        with self._translated("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
        return sorted(keys)

    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    @contextmanager
    def _translated(self, action: str, key: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError, Boto3Error, OSError) as exc:
            raise _storage_error(exc, f"{action} {key!r} in {self.describe()}") from exc


class _Counter:
    """boto3's transfer callback gets increments from several threads: report the total."""

    def __init__(self, on_bytes: Callable[[int], None]) -> None:
        self.on_bytes = on_bytes
        self.done = 0
        self.lock = threading.Lock()

    def __call__(self, increment: int) -> None:
        with self.lock:
            self.done += increment
            self.on_bytes(self.done)


def _is_code(exc: BaseException | None, code: str) -> bool:
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == code
