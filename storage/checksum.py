"""SHA-256 of model files: computed once where a file enters the fleet, recorded next to it in
the object store (`<key>.sha256`) and checked wherever a copy lands in a local cache."""

import hashlib
from pathlib import Path

from storage.errors import ChecksumMismatch

CHECKSUM_SUFFIX = ".sha256"
CHUNK = 1024 * 1024


def checksum_key(key: str) -> str:
    """The store key that holds the hex SHA-256 of the object `key`."""
    return key + CHECKSUM_SUFFIX


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def parse_checksum(raw: bytes) -> str:
    """The hex digest recorded in a `.sha256` object (`sha256sum` lines are accepted too)."""
    word = raw.decode("ascii", errors="replace").strip().split(" ", 1)[0].lower()
    if len(word) != 64 or any(c not in "0123456789abcdef" for c in word):
        raise ChecksumMismatch(f"unreadable checksum record {raw[:80]!r}")
    return word


def verify(path: Path, expected: str, what: str) -> str:
    """`expected` if the file's SHA-256 is that, else ChecksumMismatch (the file is left as is)."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ChecksumMismatch(f"{what}: checksum mismatch (expected sha256 {expected}, "
                               f"got {actual}); the file is refused")
    return actual
