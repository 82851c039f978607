"""Object storage: the ObjectStore interface, a local-folder and an S3 implementation
(`storage.s3`, imported only where a store is in S3: boto3 costs ~25 MB of every process),
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
    "SlotSnapshotStore",
    "StorageError",
    "StorageUnavailable",
    "check_key",
    "check_prefix",
    "check_slot_name",
    "default_model_path",
    "open_store",
]
