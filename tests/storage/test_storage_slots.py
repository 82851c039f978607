"""SlotSnapshotStore over both store kinds."""

import pytest

from storage import InvalidKey, ObjectNotFound, ObjectStore, SlotSnapshotStore


def test_round_trip_and_delete(store: ObjectStore) -> None:
    slots = SlotSnapshotStore(store)
    meta = {"n_tokens": 42, "model": "gemma", "tokens": [1, 2, 3]}
    slots.save("slot0.bin", b"\x01\x02kv-state", meta)
    assert store.list_keys("slots/") == ["slots/slot0.bin", "slots/slot0.bin.json"]
    assert slots.exists("slot0.bin")
    assert slots.load("slot0.bin") == (b"\x01\x02kv-state", meta)

    slots.delete("slot0.bin")
    assert not slots.exists("slot0.bin")
    assert store.list_keys("slots/") == []
    with pytest.raises(ObjectNotFound):
        slots.load("slot0.bin")
    slots.delete("slot0.bin")  # absent: no error


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "x..y", "m.json", "a\nb"])
def test_invalid_names(store: ObjectStore, name: str) -> None:
    slots = SlotSnapshotStore(store)
    with pytest.raises(InvalidKey):
        slots.save(name, b"x", {})
    with pytest.raises(InvalidKey):
        slots.load(name)
