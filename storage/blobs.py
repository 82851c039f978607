"""Bytes with JSON metadata beside them (`<key>` and `<key>.json`), the layout of slot
snapshots and KV-tier states: the bytes are written first and the metadata last, so an object
is whole once its metadata is there."""

import json
from typing import Any

from storage.base import ObjectStore
from storage.errors import StorageError


def put_with_meta(store: ObjectStore, key: str, data: bytes, meta: dict[str, Any]) -> None:
    store.put_bytes(key, data)
    store.put_bytes(key + ".json", json.dumps(meta).encode())


def get_with_meta(store: ObjectStore, key: str, what: str) -> tuple[bytes, dict[str, Any]]:
    """Raises ObjectNotFound when either part is missing, StorageError naming `what` when the
    metadata is not a JSON object."""
    meta_raw = store.get_bytes(key + ".json")
    data = store.get_bytes(key)
    try:
        meta = json.loads(meta_raw)
    except ValueError as exc:
        raise StorageError(f"{what}: corrupt metadata") from exc
    if not isinstance(meta, dict):
        raise StorageError(f"{what}: metadata is not an object")
    return data, meta


def delete_with_meta(store: ObjectStore, key: str) -> None:
    """The metadata first, so a half-deleted object reads as absent."""
    store.delete(key + ".json")
    store.delete(key)
