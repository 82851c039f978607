"""The storage package's errors; third-party errors are translated into these at the boundary.

Each class names the error of llamaq's one table (scheduler/contract/errors.py) it is rendered
as; what of its message leaves the process is redacted (storage/redact.py). Storage may import
the contract, as every layer may: the contract is the lowest floor (it imports pydantic and the
standard library alone, tests/unit/project/test_contract_floor.py), so storage still knows no Redis.
"""

from scheduler.contract.errors import (
    BadGateway,
    Conflict,
    InvalidRequest,
    MappedError,
    NotFound,
    Unavailable,
)
from storage.redact import redact


class StorageError(MappedError):
    """Base of every error the storage package raises (a 500 unless a subclass says)."""

    def public_message(self) -> str:
        return f"object storage: {redact(str(self))}"


class ObjectNotFound(StorageError):
    """The key does not exist in the store."""

    renders_as = NotFound


class StorageUnavailable(StorageError):
    """The store could not be reached (connection refused, timeout, 5xx)."""

    renders_as = Unavailable


class InvalidKey(StorageError, ValueError):
    """A key, prefix, slot name or store URL that is not allowed."""

    renders_as = InvalidRequest


class ModelNotFound(StorageError):
    """A model spec resolves to no file (not local, not in the store, not on the Hub)."""

    renders_as = NotFound


class ChecksumMismatch(StorageError):
    """A downloaded file's SHA-256 is not the one recorded for it: the file is refused."""

    renders_as = BadGateway


class DownloadCancelled(StorageError):
    """A download was paused or cancelled on request; its partial files are kept."""

    renders_as = Conflict


class DownloadFailed(StorageError):
    """A file could not be downloaded from its origin (Hugging Face, a URL)."""

    renders_as = BadGateway
