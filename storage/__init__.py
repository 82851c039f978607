"""Object storage: the ObjectStore interface, a local-folder and an S3 implementation,
model-file resolution and slot snapshots. Imports nothing else of llamaq."""

from storage.base import ObjectStore, check_key, check_prefix
from storage.errors import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    InvalidKey,
    ModelNotFound,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from storage.factory import open_store
from storage.local import LocalStore
from storage.models import ModelFiles, default_model_path
from storage.s3 import S3Store, make_s3_client
from storage.slots import SlotSnapshotStore, check_slot_name

__all__ = [
    "ChecksumMismatch",
    "DownloadCancelled",
    "DownloadFailed",
    "InvalidKey",
    "LocalStore",
    "ModelFiles",
    "ModelNotFound",
    "ObjectNotFound",
    "ObjectStore",
    "S3Store",
    "SlotSnapshotStore",
    "StorageError",
    "StorageUnavailable",
    "check_key",
    "check_prefix",
    "check_slot_name",
    "default_model_path",
    "make_s3_client",
    "open_store",
]
