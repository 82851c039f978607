"""Slot KV-cache snapshots (llama-server's /slots save/restore) in the object store."""

import json
from typing import Any

from storage.base import ObjectStore
from storage.errors import InvalidKey, StorageError

SLOTS_PREFIX = "slots/"


def check_slot_name(name: str) -> str:
    """A plain file name, with llama.cpp's rules (no separators, no '..', no control chars).

    Names ending in '.json' are refused: they would collide with another slot's metadata key.
    """
    bad = (
        not name
        or name == "."
        or ".." in name
        or any(c in name for c in "/\\")
        or any(ord(c) < 32 for c in name)
        or name.endswith(".json")
    )
    if bad:
        raise InvalidKey(f"invalid slot file name {name!r}")
    return name


class SlotSnapshotStore:
    """Snapshot bytes at `slots/<name>`, its metadata (JSON) at `slots/<name>.json`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def save(self, name: str, data: bytes, meta: dict[str, Any]) -> None:
        key = SLOTS_PREFIX + check_slot_name(name)
        self.store.put_bytes(key, data)
        self.store.put_bytes(key + ".json", json.dumps(meta).encode())

    def load(self, name: str) -> tuple[bytes, dict[str, Any]]:
        """Raises ObjectNotFound if no snapshot has that name."""
        key = SLOTS_PREFIX + check_slot_name(name)
        meta_raw = self.store.get_bytes(key + ".json")
        data = self.store.get_bytes(key)
        try:
            meta = json.loads(meta_raw)
        except ValueError as exc:
            raise StorageError(f"slot snapshot {name!r}: corrupt metadata") from exc
        if not isinstance(meta, dict):
            raise StorageError(f"slot snapshot {name!r}: metadata is not an object")
        return data, meta

    def exists(self, name: str) -> bool:
        return self.store.exists(SLOTS_PREFIX + check_slot_name(name) + ".json")

    def delete(self, name: str) -> None:
        key = SLOTS_PREFIX + check_slot_name(name)
        self.store.delete(key + ".json")
        self.store.delete(key)
