"""KV states of token prefixes (the fleet-wide KV tier, worker/kv_tier.py) in the object store:
the state's bytes at `kv/<fingerprint>/<prefix hash>`, its metadata (JSON: the fingerprint and
the tokens it holds, checked on restore) beside it at `.../<prefix hash>.json`."""

import json
from typing import Any

from storage.base import ObjectStore, check_key
from storage.errors import StorageError

KV_PREFIX = "kv/"


class KvStateStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def key(fingerprint: str, prefix_hash: str) -> str:
        return check_key(f"{KV_PREFIX}{fingerprint}/{prefix_hash}")

    def save(self, fingerprint: str, prefix_hash: str, data: bytes, meta: dict[str, Any]) -> None:
        """The bytes first, the metadata last: a state is whole once its metadata is there."""
        key = self.key(fingerprint, prefix_hash)
        self.store.put_bytes(key, data)
        self.store.put_bytes(key + ".json", json.dumps(meta).encode())

    def load(self, fingerprint: str, prefix_hash: str) -> tuple[bytes, dict[str, Any]]:
        """Raises ObjectNotFound when the state is gone (evicted, or never whole)."""
        key = self.key(fingerprint, prefix_hash)
        meta_raw = self.store.get_bytes(key + ".json")
        data = self.store.get_bytes(key)
        try:
            meta = json.loads(meta_raw)
        except ValueError as exc:
            raise StorageError(f"kv state {prefix_hash}: corrupt metadata") from exc
        if not isinstance(meta, dict):
            raise StorageError(f"kv state {prefix_hash}: metadata is not an object")
        return data, meta

    def delete(self, fingerprint: str, prefix_hash: str) -> None:
        key = self.key(fingerprint, prefix_hash)
        self.store.delete(key + ".json")
        self.store.delete(key)
