"""An object store in a local folder (the default when no S3 is configured)."""

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from storage._fs import atomic_path
from storage.base import check_key, check_prefix
from storage.errors import InvalidKey, ObjectNotFound, StorageError

COPY_CHUNK = 1024 * 1024
STAGING_DIR = ".staging"  # temp files live here until renamed into place; never listed


class LocalStore:
    """Objects are files under `root`; writes are atomic (temp file + os.replace)."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self._staging = self.root / STAGING_DIR
        with self._translated("create store folder", str(self.root)):
            self._staging.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"local folder {self.root}"

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._translated("write", key), atomic_path(path, self._staging) as tmp:
            tmp.write_bytes(data)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        with self._translated("read", key, reading=True):
            return path.read_bytes()

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        with self._translated("upload", key), atomic_path(target, self._staging) as tmp:
            shutil.copyfile(path, tmp)

    def get_file(self, key: str, path: Path,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        source = self._path(key)
        with self._translated("read", key, reading=True):
            reader = source.open("rb")
        with (
            reader,
            self._translated("download", key),
            atomic_path(path) as tmp,
            tmp.open("wb") as writer,
        ):
            done = 0
            while chunk := reader.read(COPY_CHUNK):
                writer.write(chunk)
                done += len(chunk)
                if on_bytes is not None:
                    on_bytes(done)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(f"{key!r} not found in {self.describe()}")
        with self._translated("stat", key, reading=True):
            return path.stat().st_size

    def delete(self, key: str) -> None:
        path = self._path(key)
        with self._translated("delete", key):
            if path.is_file():
                path.unlink(missing_ok=True)

    def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        start = self.root / prefix.rpartition("/")[0]
        keys: list[str] = []
        with self._translated("list", prefix):
            for dirpath, dirnames, filenames in os.walk(start):
                folder = Path(dirpath).relative_to(self.root).as_posix()
                if folder == ".":
                    dirnames[:] = [d for d in dirnames if d != STAGING_DIR]
                    folder = ""
                for name in filenames:
                    key = f"{folder}/{name}" if folder else name
                    if key.startswith(prefix):
                        keys.append(key)
        return sorted(keys)

    def _path(self, key: str) -> Path:
        check_key(key)
        if key.split("/", 1)[0] == STAGING_DIR:
            raise InvalidKey(f"invalid object key {key!r}: {STAGING_DIR}/ is reserved")
        return self.root / key

    @contextmanager
    def _translated(self, action: str, key: str, reading: bool = False) -> Iterator[None]:
        """Turn OSError into StorageError (ObjectNotFound for a missing file when reading)."""
        try:
            yield
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            if reading:
                raise ObjectNotFound(f"{key!r} not found in {self.describe()}") from exc
            raise StorageError(f"{action} {key!r} in {self.describe()}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"{action} {key!r} in {self.describe()}: {exc}") from exc
