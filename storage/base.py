"""The object-store interface and the key rules every implementation shares."""

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from storage.errors import InvalidKey


@runtime_checkable
class ObjectStore(Protocol):
    """Blobs under '/'-separated relative keys. Every method raises only StorageError subclasses."""

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_bytes(self, key: str) -> bytes:
        """The object's content; ObjectNotFound if absent."""
        ...

    def put_file(self, key: str, path: Path) -> None: ...

    def get_file(self, key: str, path: Path,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        """Download to `path` atomically (temp file then rename); ObjectNotFound if absent.
        `on_bytes` is called with the bytes written so far, as they arrive."""
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Size in bytes; ObjectNotFound if absent."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; no error if it is absent."""
        ...

    def list_keys(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with `prefix` (a plain string prefix, not only a folder)."""
        ...

    def describe(self) -> str:
        """Where the store is, for logs."""
        ...


def _bad_segment(segment: str) -> bool:
    return segment in ("", ".", "..") or "\x00" in segment


def check_key(key: str) -> str:
    """Return `key` if it is a valid key, else raise InvalidKey."""
    if not key or key.startswith("/") or any(_bad_segment(s) for s in key.split("/")):
        raise InvalidKey(f"invalid object key {key!r}: must be a relative '/'-separated name")
    return key


def check_prefix(prefix: str) -> str:
    """Like check_key, but empty is allowed and the last segment may be empty ('models/')."""
    if not prefix:
        return prefix
    *head, last = prefix.split("/")
    if any(_bad_segment(s) for s in head) or last in (".", "..") or "\x00" in last:
        raise InvalidKey(f"invalid key prefix {prefix!r}")
    return prefix
