"""The Hugging Face Hub through huggingface-hub (`-hf`, `-hff`, `POST /models`): which files a
`<user>/<model>[:quant]` names (llama.cpp's rules, common/download.cpp), their SHA-256 from the
Hub's tree listing, and downloads into the local hub cache (huggingface-hub's layout) with
progress and resume: huggingface-hub itself drops a partial file when its download stops, so
the bytes are fetched by storage.url_fetch into a partial blob that a later attempt continues."""

import logging
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from storage._fs import file_lock
from storage.errors import DownloadFailed, ModelNotFound
from storage.progress import DownloadListener
from storage.url_fetch import PARTIAL_SUFFIX, download_url

logger = logging.getLogger(__name__)

HUB_CACHE_FOLDER = "huggingface"
LIST_TIMEOUT_S = 10.0
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
SIDECAR_KEYWORDS = {"mmproj": "mmproj", "mtp": "mtp-", "dflash": "dflash-",
                    "eagle3": "eagle3-", "dspark": "dspark-"}
"""The sidecar kinds of the spec's POST /models and the file-name marks -hf finds them by."""
_NOT_MODEL_MARKS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_QUANT_BITS = re.compile(r"[QqFf](\d+)")
HUB_MODULES = ("huggingface_hub", "httpx", "httpx2", "httpcore")
"""huggingface-hub (imported only where the Hub is used: ~8 MB of every worker otherwise) and
the HTTP clients it brings (httpx too is imported only for a download, storage/url_fetch.py)."""


def is_hub_error(exc: BaseException) -> bool:
    """An error of huggingface-hub (its own errors, bad ids, cache I/O) or of the HTTP client
    it brings (network, timeouts)."""
    return isinstance(exc, OSError | ValueError) or any(  # httpx's errors by their module
        cls.__module__.split(".")[0] in HUB_MODULES for cls in type(exc).__mro__)


def hub_endpoint(environ: Mapping[str, str]) -> str | None:
    """The Hub to use: MODEL_ENDPOINT, else HF_ENDPOINT (as llama.cpp reads them), else
    huggingface-hub's default."""
    return environ.get("MODEL_ENDPOINT") or environ.get("HF_ENDPOINT") or None


def hub_cache_dir(cache_dir: Path) -> Path:
    """Where Hub downloads live inside a model cache (the hub's own layout, models--org--repo)."""
    return cache_dir.expanduser() / HUB_CACHE_FOLDER


def split_repo_tag(repo: str) -> tuple[str, str]:
    """`org/name:Q8_0` → (`org/name`, `Q8_0`); the tag may be empty."""
    repo_id, _, tag = repo.partition(":")
    return repo_id, tag


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None
    """The LFS object id (the file's SHA-256); None for a small file kept in git."""


@dataclass(frozen=True)
class HubPlan:
    """The files one `-hf` names: the model (every part of a split GGUF) and its sidecars."""

    repo_id: str
    model_files: tuple[HubFile, ...]
    sidecars: dict[str, HubFile]

    @property
    def primary(self) -> HubFile:
        return self.model_files[0]

    def all_files(self) -> list[HubFile]:
        return [*self.model_files, *self.sidecars.values()]


def _split_info(path: str) -> tuple[str, int, int] | None:
    match = _SPLIT.match(path)
    return (match["prefix"], int(match["index"]), int(match["count"])) if match else None


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(mark in name for mark in _NOT_MODEL_MARKS)


def _first_part(path: str) -> bool:
    split = _split_info(path)
    return split is None or split[1] == 1


def pick_model(paths: list[str], tag: str) -> str | None:
    """llama.cpp's rule: the first model file matching the tag (`<tag>.` or `<tag>-`, any case);
    without a tag Q4_K_M, then Q8_0, then the first model file; a tag that matches nothing
    picks nothing."""
    for wanted in [tag] if tag else list(DEFAULT_TAGS):
        pattern = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        for path in paths:
            if is_model_file(path) and pattern.search(path) and _first_part(path):
                return path
    if not tag:
        return next((p for p in paths if is_model_file(p) and _first_part(p)), None)
    return None


def split_parts(paths: list[str], primary: str) -> list[str]:
    """Every part of the split GGUF `primary` (in order), or [primary]."""
    split = _split_info(primary)
    if split is None:
        return [primary]
    prefix, _, count = split
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _quant_bits(path: str) -> int:
    match = _QUANT_BITS.search(path.rsplit("/", 1)[-1].split("-")[-1])
    return int(match[1]) if match else 0


def pick_sidecar(paths: list[str], primary: str, kind: str, tag: str) -> str | None:
    """The sidecar of `kind` llama.cpp would pick: deepest folder shared with the model, then
    an exact tag, then the closest quantization."""
    keyword = SIDECAR_KEYWORDS[kind]
    model_dir = primary.split("/")[:-1]
    bits = int(m[0]) if tag and (m := re.search(r"\d+", tag)) else _quant_bits(primary)
    best: tuple[int, bool, int] | None = None
    chosen = None
    for path in paths:
        if not path.endswith(".gguf") or keyword not in path.rsplit("/", 1)[-1]:
            continue
        folder = path.split("/")[:-1]
        if folder != model_dir[:len(folder)]:
            continue
        exact = bool(tag) and f"-{tag.upper()}." in path.upper()
        rank = (len(folder), exact, -abs(_quant_bits(path) - bits))
        if best is None or rank > best:
            best, chosen = rank, path
    return chosen


class HubClient:
    """One Hub (HF_ENDPOINT, or huggingface.co) with one token, downloading into `cache_dir`."""

    def __init__(self, cache_dir: Path, *, endpoint: str | None = None,
                 token: str | None = None, offline: bool = False) -> None:
        self.cache_dir = hub_cache_dir(cache_dir)
        self.endpoint = endpoint.rstrip("/") if endpoint else None
        self.token = token
        self.offline = offline

    @property
    def _base(self) -> str:
        """The Hub's URL (the library's default, HF_ENDPOINT or huggingface.co, unless set)."""
        from huggingface_hub import constants

        return self.endpoint or constants.ENDPOINT

    def file_url(self, repo_id: str, path: str) -> str:
        return f"{self._base}/{repo_id}/resolve/main/{path}"

    def list_files(self, repo_id: str) -> list[HubFile]:
        """The repo's files with their sizes and SHA-256, from the Hub (or, offline, from the
        cached snapshot, without checksums)."""
        if self.offline:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(repo_id, token=self.token, local_files_only=True,
                                            cache_dir=self.cache_dir))
            return [HubFile(p.relative_to(folder).as_posix(), p.stat().st_size, None)
                    for p in sorted(folder.rglob("*")) if p.is_file()]
        entries = [e for e in self._tree(repo_id) if e.get("type") == "file"]
        return [HubFile(str(e["path"]), int(e.get("size") or 0),
                        str(e["lfs"]["oid"]) if isinstance(e.get("lfs"), dict) else None)
                for e in entries]

    def _tree(self, repo_id: str) -> Iterator[dict[str, Any]]:
        """The Hub's recursive tree listing, page by page, in one try per page (the hub
        library's own listing retries for half a minute when the Hub is unreachable, and a
        machine without internet then falls back to the object store)."""
        from huggingface_hub.utils import (
            build_hf_headers,
            get_session,
            hf_raise_for_status,
            validate_repo_id,
        )

        validate_repo_id(repo_id)
        url: str | None = f"{self._base}/api/models/{repo_id}/tree/main"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        while url:
            response = get_session().get(url, params=params, timeout=LIST_TIMEOUT_S,
                                         headers=build_hf_headers(token=self.token))
            hf_raise_for_status(response)
            page = response.json()
            if not isinstance(page, list):
                raise ValueError(f"unexpected tree listing from {url}")
            yield from (e for e in page if isinstance(e, dict))
            url, params = response.links.get("next", {}).get("url"), None

    def plan(self, repo: str, file: str | None = None,
             sidecars: tuple[str, ...] = ()) -> HubPlan:
        """The files `-hf repo[:tag]` (`-hff file`) names; ModelNotFound when none matches."""
        repo_id, tag = split_repo_tag(repo)
        try:
            files = self.list_files(repo_id)
        except Exception as exc:
            if not is_hub_error(exc):
                raise
            raise ModelNotFound(f"Hugging Face repo {repo_id!r}: {type(exc).__name__}: "
                                f"{exc}") from exc
        return plan_from_files(repo_id, tag, files, file, sidecars)

    def cached(self, repo_id: str, hub_file: HubFile) -> Path | None:
        """The file from the local hub cache when it is there and is the Hub's current one
        (a cached LFS blob is named by its SHA-256, so no re-hashing is needed)."""
        if hub_file.sha256 is None:
            return None
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, hub_file.path, cache_dir=self.cache_dir)
        if not isinstance(found, str):
            return None
        path = Path(found)
        return path if path.resolve().name == hub_file.sha256 else None

    def remove_cached(self, repo_id: str, paths: list[str], *, partials: bool) -> None:
        """Drop files of `repo_id` from the local hub cache (their snapshot links and blobs;
        with `partials`, the partial blobs of unfinished downloads too); the whole repo folder
        when nothing is left in it."""
        from huggingface_hub.file_download import repo_folder_name

        repo_dir = self.cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")
        for link in [*repo_dir.glob("snapshots/*/**/*")]:
            rel = link.relative_to(repo_dir / "snapshots").as_posix().split("/", 1)[-1]
            if rel in paths and link.is_symlink():
                link.resolve().unlink(missing_ok=True)
                link.unlink(missing_ok=True)
        if partials:
            for partial in repo_dir.glob(f"blobs/*{PARTIAL_SUFFIX}"):
                partial.unlink(missing_ok=True)
        blobs = repo_dir / "blobs"
        if repo_dir.is_dir() and not (blobs.is_dir() and any(
                not p.name.startswith(".") for p in blobs.iterdir())):  # lock files only
            shutil.rmtree(repo_dir, ignore_errors=True)

    def download(self, repo_id: str, hub_file: HubFile, listener: DownloadListener) -> Path:
        """One file into the hub cache (its layout: blobs named by ETag, a snapshot link per
        commit), resumed from the partial blob an earlier attempt left; offline: the cache."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.file_download import repo_folder_name
        from huggingface_hub.utils import build_hf_headers

        try:
            if self.offline:
                return Path(hf_hub_download(repo_id, hub_file.path, cache_dir=self.cache_dir,
                                            local_files_only=True))
            url = hf_hub_url(repo_id, hub_file.path, endpoint=self.endpoint)
            meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        except Exception as exc:
            if not is_hub_error(exc):
                raise
            raise DownloadFailed(f"Hugging Face file {repo_id}/{hub_file.path}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        if not meta.commit_hash or not meta.etag:
            raise DownloadFailed(f"{url}: not a Hugging Face Hub answer (no commit or ETag)")
        repo_dir = self.cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")
        blob = repo_dir / "blobs" / meta.etag
        link = repo_dir / "snapshots" / meta.commit_hash / hub_file.path
        with file_lock(blob.with_name(f".{blob.name}.lock")):  # one writer per machine
            if not blob.is_file():
                same_host = urlsplit(meta.location).netloc == urlsplit(url).netloc
                headers = build_hf_headers(token=self.token) if same_host else {}
                download_url(meta.location, blob, listener, headers=headers, source=url)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_file():  # under the lock: another process never unlinks ours
                link.unlink(missing_ok=True)
                link.symlink_to(os.path.relpath(blob, link.parent))
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(meta.commit_hash)
        return link


def plan_from_files(repo_id: str, tag: str, files: list[HubFile], file: str | None,
                    sidecars: tuple[str, ...]) -> HubPlan:
    by_path = {f.path: f for f in files}
    paths = sorted(by_path)
    if file:
        if file not in by_path:
            raise ModelNotFound(f"file {file!r} not found in Hugging Face repo {repo_id!r}")
        primary: str | None = file
    else:
        primary = pick_model(paths, tag)
    if primary is None:
        wanted = f"tag {tag!r}" if tag else "GGUF model file"
        raise ModelNotFound(f"no {wanted} found in Hugging Face repo {repo_id!r} "
                            f"(GGUF files: {', '.join(p for p in paths if p.endswith('.gguf'))})")
    parts = split_parts(paths, primary)
    missing = [p for p in parts if p not in by_path]
    if missing:
        raise ModelNotFound(f"Hugging Face repo {repo_id!r} lacks parts {missing} of {primary}")
    found = {kind: by_path[p] for kind in sidecars
             if (p := pick_sidecar(paths, primary, kind, tag)) is not None}
    return HubPlan(repo_id, tuple(by_path[p] for p in parts), found)
