"""KV states of token prefixes (the fleet-wide KV tier, worker/kv/tier.py) in the object store:
the state's bytes at `kv/<fingerprint>/<prefix hash>`, its metadata (JSON: the fingerprint and
the tokens it holds, checked on restore) beside it at `.../<prefix hash>.json`
(storage/blobs.py)."""

from typing import Any

from storage.base import ObjectStore, check_key
from storage.blobs import delete_with_meta, get_with_meta, put_with_meta

KV_PREFIX = "kv/"


class KvStateStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def key(fingerprint: str, prefix_hash: str) -> str:
        return check_key(f"{KV_PREFIX}{fingerprint}/{prefix_hash}")

    def save(self, fingerprint: str, prefix_hash: str, data: bytes, meta: dict[str, Any]) -> None:
        put_with_meta(self.store, self.key(fingerprint, prefix_hash), data, meta)

    def load(self, fingerprint: str, prefix_hash: str) -> tuple[bytes, dict[str, Any]]:
        """Raises ObjectNotFound when the state is gone (evicted, or never whole)."""
        return get_with_meta(self.store, self.key(fingerprint, prefix_hash),
                             f"kv state {prefix_hash}")

    def delete(self, fingerprint: str, prefix_hash: str) -> None:
        delete_with_meta(self.store, self.key(fingerprint, prefix_hash))
