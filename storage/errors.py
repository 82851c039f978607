"""The storage package's errors; third-party errors are translated into these at the boundary.

Each class names the HTTP status and error ``type`` the api should render it with.
"""

from typing import ClassVar


class StorageError(Exception):
    """Base of every error the storage package raises."""

    http_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"


class ObjectNotFound(StorageError):
    """The key does not exist in the store."""

    http_status = 404
    error_type = "not_found_error"


class StorageUnavailable(StorageError):
    """The store could not be reached (connection refused, timeout, 5xx)."""

    http_status = 503
    error_type = "unavailable_error"


class InvalidKey(StorageError, ValueError):
    """A key, prefix, slot name or store URL that is not allowed."""

    http_status = 400
    error_type = "invalid_request_error"


class ModelNotFound(StorageError):
    """A model spec resolves to no file (not local, not in the store, not on the Hub)."""

    http_status = 404
    error_type = "not_found_error"


class ChecksumMismatch(StorageError):
    """A downloaded file's SHA-256 is not the one recorded for it: the file is refused."""

    http_status = 502
    error_type = "server_error"


class DownloadCancelled(StorageError):
    """A download was paused or cancelled on request; its partial files are kept."""

    http_status = 409
    error_type = "invalid_request_error"


class DownloadFailed(StorageError):
    """A file could not be downloaded from its origin (Hugging Face, a URL)."""

    http_status = 502
    error_type = "server_error"
