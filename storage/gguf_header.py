"""The key-value metadata of a GGUF file, read from its header without loading the model
(pure Python: api pods have no llama.cpp). Tensor data is never read.

GGUF layout (ggml's gguf.h): magic "GGUF", version (uint32, 2 or 3), tensor count and
key-value count (uint64), then each key-value: key (uint64 length + UTF-8), value type (uint32),
value. Strings are length-prefixed; arrays carry their item type and count.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
MAX_KV = 1 << 20
"""More key-values than this is a corrupt (or hostile) header, not a model."""
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
STRING, ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """Not a GGUF file, or a header that does not parse."""


class _Reader:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise GGUFHeaderError("truncated GGUF header")
        chunk = self.data[self.pos:end]
        self.pos = end
        return bytes(chunk)

    def scalar(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("<Q", 8)
        return self.take(n).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.scalar("<Q", 8)
        self.pos += n
        if self.pos > len(self.data):
            raise GGUFHeaderError("truncated GGUF header")

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.scalar(*_SCALARS[kind])
        if kind == STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if kind == ARRAY:
            item, count = self.scalar("<I", 4), self.scalar("<Q", 8)
            if item in _SCALARS and not keep:  # fixed size: skip in one move
                self.pos += _SCALARS[item][1] * count
                if self.pos > len(self.data):
                    raise GGUFHeaderError("truncated GGUF header")
                return None
            values = [self.value(item, keep) for _ in range(count)]
            return values if keep else None
        raise GGUFHeaderError(f"unknown GGUF value type {kind}")


def read_metadata(path: Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, Any]:
    """The metadata whose keys start with one of `prefixes` (all of it by default); values of
    other keys are skipped, not decoded (a vocabulary of 262k strings costs a walk only)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        reader = _Reader(data)
        if reader.take(4) != MAGIC:
            raise GGUFHeaderError(f"{path.name} is not a GGUF file")
        version = reader.scalar("<I", 4)
        if version not in (2, 3):
            raise GGUFHeaderError(f"unsupported GGUF version {version}")
        reader.scalar("<Q", 8)  # tensor count
        n_kv = reader.scalar("<Q", 8)
        if n_kv > MAX_KV:
            raise GGUFHeaderError("too many GGUF key-values")
        found: dict[str, Any] = {}
        for _ in range(n_kv):
            key = reader.string()
            kind = reader.scalar("<I", 4)
            keep = key.startswith(prefixes)
            value = reader.value(kind, keep)
            if keep:
                found[key] = value
        return found
