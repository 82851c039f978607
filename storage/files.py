"""Uploaded files (the OpenAI Files API) and batch result chunks in the object store.

A file is two objects: its content at `files/<id>/content`, then its description (JSON) at
`files/<id>/meta.json`, written last so that a file is listed only once it is whole. A batch's
results are one object per chunk at `batches/<batch id>/chunk-<index>`, replaced when the chunk
runs again (never appended to: S3 cannot append), concatenated into the output and error files
when the batch finalizes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from scheduler.contract.deferred import DeferredModel
from storage.base import ObjectStore
from storage.errors import InvalidKey, ObjectNotFound, StorageError

FILES_PREFIX = "files/"
BATCHES_PREFIX = "batches/"
ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_id(object_id: str) -> str:
    """File and batch ids name store keys: letters, digits, '_' and '-' only."""
    if not ID_PATTERN.match(object_id):
        raise InvalidKey(f"invalid id {object_id!r}")
    return object_id


class StoredFile(DeferredModel):
    """A file as the Files API describes it."""

    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None
    owner: str = "default"
    """The tenant that made it (ours, not on the wire; files from before tenants: default)."""

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(exclude={"owner"})


class FileStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def _key(file_id: str, part: str) -> str:
        return f"{FILES_PREFIX}{check_id(file_id)}/{part}"

    def put(self, meta: StoredFile, data: bytes) -> None:
        self.store.put_bytes(self._key(meta.id, "content"), data)
        self.store.put_bytes(self._key(meta.id, "meta.json"), meta.model_dump_json().encode())

    def put_path(self, meta: StoredFile, path: Path) -> None:
        """The content from a local file (a big output file is never held in memory)."""
        self.store.put_file(self._key(meta.id, "content"), path)
        self.store.put_bytes(self._key(meta.id, "meta.json"), meta.model_dump_json().encode())

    def meta(self, file_id: str) -> StoredFile:
        """ObjectNotFound if there is no such file (or its id is not one we could mint)."""
        try:
            raw = self.store.get_bytes(self._key(file_id, "meta.json"))
        except InvalidKey:
            raise ObjectNotFound(f"no file {file_id!r}") from None
        try:
            return StoredFile.model_validate_json(raw)
        except ValidationError as error:
            raise StorageError(f"file {file_id!r}: corrupt description") from error

    def content(self, file_id: str) -> bytes:
        self.meta(file_id)
        return self.store.get_bytes(self._key(file_id, "content"))

    def content_to(self, file_id: str, path: Path) -> None:
        self.meta(file_id)
        self.store.get_file(self._key(file_id, "content"), path)

    def delete(self, file_id: str) -> None:
        self.meta(file_id)
        self.store.delete(self._key(file_id, "meta.json"))
        self.store.delete(self._key(file_id, "content"))

    def list(self) -> list[StoredFile]:
        files = []
        for key in self.store.list_keys(FILES_PREFIX):
            if key.endswith("/meta.json"):
                try:
                    files.append(self.meta(key[len(FILES_PREFIX):-len("/meta.json")]))
                except (ObjectNotFound, StorageError):
                    continue  # deleted meanwhile, or not ours
        return files


class ChunkResult(DeferredModel):
    """One chunk's result lines, already rendered (JSON text, one line each)."""

    output: list[str]
    errors: list[str]


class ChunkStore:
    """`batches/<batch id>/chunk-<index>`: a header line (counts), then the output lines,
    then the error lines."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def _prefix(batch_id: str) -> str:
        return f"{BATCHES_PREFIX}{check_id(batch_id)}/"

    def _key(self, batch_id: str, index: int) -> str:
        return f"{self._prefix(batch_id)}chunk-{index:06d}"

    def put(self, batch_id: str, index: int, result: ChunkResult) -> None:
        header = json.dumps({"output": len(result.output), "errors": len(result.errors)})
        text = "\n".join([header, *result.output, *result.errors]) + "\n"
        self.store.put_bytes(self._key(batch_id, index), text.encode())

    def get(self, batch_id: str, index: int) -> ChunkResult:
        lines = self.store.get_bytes(self._key(batch_id, index)).decode().splitlines()
        try:
            header = json.loads(lines[0])
            n_output = int(header["output"])
            n_errors = int(header["errors"])
        except (IndexError, ValueError, KeyError, TypeError) as error:
            raise StorageError(f"batch {batch_id!r} chunk {index}: corrupt") from error
        if len(lines) != 1 + n_output + n_errors:
            raise StorageError(f"batch {batch_id!r} chunk {index}: truncated")
        return ChunkResult(output=lines[1:1 + n_output], errors=lines[1 + n_output:])

    def indexes(self, batch_id: str) -> list[int]:
        prefix = self._prefix(batch_id) + "chunk-"
        return sorted(int(key[len(prefix):]) for key in self.store.list_keys(prefix))

    def delete_all(self, batch_id: str, indexes: Iterable[int] | None = None) -> None:
        for index in self.indexes(batch_id) if indexes is None else indexes:
            self.store.delete(self._key(batch_id, index))
