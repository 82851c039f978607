"""`llamaq models push FILE`: upload a local GGUF to the object store, with its SHA-256, so that
every worker can serve it with `-m NAME` (pulled into each machine's cache and checked)."""

from __future__ import annotations

import sys
from pathlib import Path

from scheduler.config.settings import ProcessSettings, flag
from storage import StorageError, open_store
from storage.checksum import checksum_key, sha256_file
from storage.models import MODELS_PREFIX
from storage.redact import redact

USAGE = """usage: llamaq models push FILE [--name NAME] [--store-url URL] [--s3-endpoint-url URL]

  push   upload the GGUF FILE to the object store as models/NAME (default: the file's name);
         workers then serve it with `-m NAME`"""
GGUF_MAGIC = b"GGUF"


class PushSettings(ProcessSettings):
    """Where `llamaq models push` uploads."""

    prog = "llamaq models push FILE"

    name: str | None = flag(None, "--name", help="the model's name in the store (models/NAME)")
    store_url: str = flag(".llamaq/store", "--store-url", env="LLAMAQ_STORE_URL",
                          help="object store: a folder, or s3://bucket/prefix")
    s3_endpoint_url: str | None = flag(None, "--s3-endpoint-url", env="LLAMAQ_S3_ENDPOINT_URL",
                                       help="S3 endpoint URL (MinIO, moto, ...)")


def push(path: Path, settings: PushSettings) -> tuple[str, str]:
    """Upload `path`; returns its key and SHA-256. ValueError for a file that is not a GGUF."""
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
    name = (settings.name or path.name).removeprefix(MODELS_PREFIX)
    key = MODELS_PREFIX + name
    digest = sha256_file(path)
    store = open_store(settings.store_url, settings.s3_endpoint_url)
    store.put_bytes(checksum_key(key), (digest + "\n").encode())
    store.put_file(key, path)
    return key, digest


def run_models(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] != "push" or len(argv) < 2 or argv[1].startswith("-"):
        sys.exit(f"llamaq models: expected `push FILE`\n\n{USAGE}")
    path = Path(argv[1])
    settings = PushSettings.from_args(argv[2:])
    if not path.is_file():
        sys.exit(f"llamaq models push: no such file: {path}")
    try:
        key, digest = push(path, settings)
    except ValueError as exc:
        sys.exit(f"llamaq models push: {exc}")
    except (StorageError, OSError) as exc:
        sys.exit(f"llamaq models push: {redact(str(exc))}")
    print(f"{key} sha256:{digest}")
    print(f"serve it with: llamaq worker -m {key.removeprefix(MODELS_PREFIX)}")
