"""Static files held in memory, with their content type, ETag, caching policy and gzip copy."""

from __future__ import annotations

import functools
import gzip
import hashlib
import mimetypes
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

BUNDLE_DIR = Path(__file__).resolve().parents[2] / "ui_dist"
"""llama.cpp's web UI: in the package (the api image), or a link to scripts/build-ui's build
(scripts/install makes it)."""
PIN = re.compile(r'"llama-cpp-python==([^"]+)"')
IMMUTABLE_DIR = "_app/immutable/"
"""Vite writes content-hashed names here: they never change, so browsers keep them for a year."""
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
"""Everything else (index.html, sw.js, the manifest, version.json) is checked on every load."""
COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml",
                "application/manifest+json")
MEDIA_TYPES = {".js": "application/javascript", ".mjs": "application/javascript",
               ".webmanifest": "application/manifest+json", ".svg": "image/svg+xml",
               ".json": "application/json", ".css": "text/css", ".html": "text/html"}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    compressible: bool
    content_type: str
    etag: str
    cache_control: str

    @functools.cached_property
    def gzipped(self) -> bytes:
        """The gzip copy of a `compressible` file, made when first asked for, not at start: the
        UI's 9 MB script takes 0.4 s of CPU to compress, which a pod that never serves the
        UI paid at every start. Thread-safe (the copy is the same whichever thread makes it)."""
        return gzip.compress(self.body, mtime=0)


def _content_type(path: str) -> str:
    suffix = PurePosixPath(path).suffix.lower()
    kind = MEDIA_TYPES.get(suffix) or mimetypes.guess_type(path)[0] or "application/octet-stream"
    if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
        return f"{kind}; charset=utf-8"
    return kind


def static_file(relative: str, body: bytes, cache_control: str) -> StaticFile:
    content_type = _content_type(relative)
    compressible = content_type.startswith(COMPRESSIBLE) and len(body) > 512
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    return StaticFile(body, compressible, content_type, etag, cache_control)


def bundle_dir() -> Path:
    """api/ui_dist, else (a checkout where scripts/install has not linked it yet) the build
    scripts/build-ui leaves in ~/.cache/llamaq-ui for the llama-cpp-python that pyproject.toml
    pins."""
    if (BUNDLE_DIR / "index.html").is_file():
        return BUNDLE_DIR
    pyproject = BUNDLE_DIR.parents[1] / "pyproject.toml"
    found = PIN.search(pyproject.read_text("utf-8")) if pyproject.is_file() else None
    if found is None:
        return BUNDLE_DIR
    cache = Path(os.environ.get("LLAMAQ_UI_CACHE") or Path.home() / ".cache" / "llamaq-ui")
    return cache / found.group(1) / "dist"


def load_bundle(folder: Path | None = None) -> dict[str, StaticFile]:
    """Every file of the built UI by its path relative to the bundle ("" is index.html)."""
    folder = folder or bundle_dir()
    if not (folder / "index.html").is_file():
        raise ValueError(f"the web UI bundle is missing ({folder}/index.html); build it with "
                         "scripts/install (or scripts/build-ui), or start with --no-ui")
    files: dict[str, StaticFile] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            relative = path.relative_to(folder).as_posix()
            policy = IMMUTABLE if relative.startswith(IMMUTABLE_DIR) else REVALIDATE
            files[relative] = static_file(relative, path.read_bytes(), policy)
    files[""] = files["index.html"]
    return files


def resolve_in(folder: Path, relative: str) -> Path | None:
    """A file inside `folder` named by a URL path, or None (missing, a folder, or outside it)."""
    root = folder.resolve()
    candidate = (root / relative.lstrip("/")).resolve()
    if candidate != root and root not in candidate.parents:
        return None
    if candidate.is_dir():
        candidate = candidate / "index.html"
    return candidate if candidate.is_file() else None
