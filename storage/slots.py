"""Slot KV-cache snapshots (llama-server's /slots save/restore) in the object store."""

from typing import Any

from storage.base import ObjectStore
from storage.blobs import delete_with_meta, get_with_meta, put_with_meta
from storage.errors import InvalidKey

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
    """Snapshot bytes at `slots/<name>`, its metadata (JSON) at `slots/<name>.json`
    (storage/blobs.py)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def save(self, name: str, data: bytes, meta: dict[str, Any]) -> None:
        put_with_meta(self.store, SLOTS_PREFIX + check_slot_name(name), data, meta)

    def load(self, name: str) -> tuple[bytes, dict[str, Any]]:
        """Raises ObjectNotFound if no snapshot has that name."""
        return get_with_meta(self.store, SLOTS_PREFIX + check_slot_name(name),
                             f"slot snapshot {name!r}")

    def exists(self, name: str) -> bool:
        return self.store.exists(SLOTS_PREFIX + check_slot_name(name) + ".json")

    def delete(self, name: str) -> None:
        delete_with_meta(self.store, SLOTS_PREFIX + check_slot_name(name))
