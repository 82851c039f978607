"""The models a router-mode fleet knows, from llama-server's sources (the spec's "Model
sources"), merged in its order of precedence:

1. the cache (`LLAMA_CACHE`, else `<cache dir>/huggingface`; Hugging Face's layout): a model
   per cached repo and quant, named `user/repo:QUANT`;
2. the object store (ours: the fleet's shared source): Hub downloads as `user/repo:TAG`
   (source `cache`, as llama-server lists downloads), pushed files as `NAME.gguf`;
3. `--models-dir`: `NAME.gguf` files and `NAME/` folders (a model file, split parts from
   `-00001-of-`, an `mmproj*` projector, `mtp-`/`dflash-`/`dspark-` draft sidecars);
   a folder or file there replaces a cache or store model of the same name;
4. `--models-preset` (INI): `[*]` holds options for every model, `[NAME]` a model's own (they
   win over `[*]`); a section named like a model of another source adds to it, any other
   needs `model` or `hf-repo`. Keys are long flags without dashes, short flags or env names.
   `load-on-startup`, `stop-timeout` and `dedup-cache-models` are preset-only keys.

The worker that loads a model gets its options (as flags) under its own command line, which
wins, as the router's own flags win in llama-server. Everything here is plain file and store
reading: no model is loaded, nothing is downloaded.
"""

from __future__ import annotations

import configparser
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from scheduler.contract.deferred import DeferredModel
from scheduler.decision_meta import metadata_output_modalities
from scheduler.gguf_meta import GgufError, read_metadata
from storage import ObjectStore, StorageError
from storage.hf import is_model_file
from storage.model_catalog import file_tag, list_stored_models

log = logging.getLogger(__name__)

SIDECAR_KINDS = ("mmproj", "mtp", "dflash", "eagle3", "dspark")
DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
_MODEL_KEYS = ("model", "m", "LLAMA_ARG_MODEL")
_HF_REPO_KEYS = ("hf-repo", "hf", "hfr", "LLAMA_ARG_HF_REPO")
_HF_FILE_KEYS = ("hf-file", "hff", "LLAMA_ARG_HF_FILE")
_MMPROJ_KEYS = ("mmproj", "mm", "LLAMA_ARG_MMPROJ")
_ALIAS_KEYS = ("alias", "a", "LLAMA_ARG_ALIAS")
_TAGS_KEYS = ("tags", "LLAMA_ARG_TAGS")
_RESERVED_KEYS = ("host", "port", "api-key", "api-key-file", "LLAMA_ARG_HOST", "LLAMA_ARG_PORT",
                  "LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")
"""Set by the router (llama-server removes them from a preset when it loads a model)."""
TRUE_WORDS = ("true", "1", "on", "yes", "enabled")


class CatalogError(ValueError):
    """A model source that cannot be read (a missing --models-dir, a bad preset file)."""


class Architecture(DeferredModel):
    input_modalities: list[str] = Field(default_factory=lambda: ["text"])
    output_modalities: list[str] = Field(default_factory=lambda: ["text"])


class ModelEntry(DeferredModel):
    """One model the router can load, with what a worker needs to load it."""

    name: str
    source: str
    """`cache`, `store`, `models_dir` or `preset` (llama-server's source names, plus ours)."""
    model: str | None = None
    """What the worker gets as -m: a local path or a store key (`store:models/X.gguf`)."""
    hf_repo: str | None = None
    hf_file: str | None = None
    local_path: str | None = None
    """The model file on this machine, if any (its metadata gives `architecture`)."""
    mmproj: str | None = None
    sidecars: list[str] = Field(default_factory=list)
    options: dict[str, str] = Field(default_factory=dict)
    """Preset options ([*] under the model's own), keys as written; passed to the worker."""
    aliases: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    load_on_startup: bool = False
    stop_timeout_s: int | None = None
    """Preset `stop-timeout`: how long an unload lets running requests finish (the worker's
    --drain-timeout for this model; none: the worker's own)."""
    hidden: bool = False
    architecture: Architecture = Field(default_factory=Architecture)

    def args(self) -> list[str]:
        """The worker's command line for this model, as `status.args` shows it."""
        args = ["llamaq", "worker"]
        if self.model:
            args += ["-m", self.model]
        if self.hf_repo:
            args += ["-hf", self.hf_repo]
        if self.hf_file:
            args += ["-hff", self.hf_file]
        if self.mmproj:
            args += ["-mm", self.mmproj]
        args += ["--alias", self.name]
        for key, value in self.options.items():
            args += option_words(key, value)
        return args


def option_words(key: str, value: str) -> list[str]:
    """A preset key and value as command-line words (env names as `NAME=value`)."""
    if key.isupper():
        return [f"{key}={value}"]
    flag = f"-{key}" if len(key) <= 3 else f"--{key}"
    return [flag, value]


@dataclass
class CatalogSources:
    models_dir: Path | None = None
    models_preset: Path | None = None
    cache_dir: Path | None = None
    """The Hugging Face cache (`LLAMA_CACHE`), if any."""
    store: ObjectStore | None = None


@dataclass
class Catalog:
    entries: dict[str, ModelEntry] = field(default_factory=dict)

    def find(self, name: str) -> ModelEntry | None:
        """The model named `name`, or whose alias it is."""
        entry = self.entries.get(name)
        if entry is not None:
            return entry
        return next((e for e in self.entries.values() if name in e.aliases), None)

    def visible(self) -> list[ModelEntry]:
        return [e for e in self.entries.values() if not e.hidden]


def load_catalog(sources: CatalogSources) -> Catalog:
    """Every model of every source, merged in llama-server's order (see the module doc)."""
    entries: dict[str, ModelEntry] = {}
    if sources.cache_dir is not None:
        entries.update(_cache_models(sources.cache_dir))
    if sources.store is not None:
        entries.update(_store_models(sources.store))
    if sources.models_dir is not None:
        entries.update(_dir_models(sources.models_dir))
    if sources.models_preset is not None:
        _apply_preset(entries, sources.models_preset)
    _check_aliases(entries)
    for entry in entries.values():
        entry.architecture = architecture_of(entry)
    return Catalog(entries)


# -- sources ----------------------------------------------------------------------------


def _is_mmproj(name: str) -> bool:
    return "mmproj" in name


def _draft_kind(name: str) -> str | None:
    return next((p[:-1] for p in DRAFT_PREFIXES if name.startswith(p)), None)


def _dir_models(folder: Path) -> dict[str, ModelEntry]:
    if not folder.is_dir():
        raise CatalogError(f"--models-dir {folder} does not exist or is not a directory")
    entries: dict[str, ModelEntry] = {}
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            entry = _folder_model(path)
            if entry is not None:
                entries[entry.name] = entry
        elif path.name.endswith(".gguf") and not _is_mmproj(path.name) \
                and _draft_kind(path.name) is None:
            name = path.name.replace(".gguf", "")
            entries[name] = ModelEntry(name=name, source="models_dir", model=str(path),
                                       local_path=str(path))
    return entries


def _folder_model(folder: Path) -> ModelEntry | None:
    """A model folder: one model file (or the first of its split parts) and sidecars."""
    model = first_shard = mmproj = None
    sidecars: list[str] = []
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(".gguf") or not path.is_file():
            continue
        if _is_mmproj(path.name):
            mmproj = path
        elif (kind := _draft_kind(path.name)) is not None:
            sidecars.append(kind)
        elif "-00001-of-" in path.name:
            first_shard = path
        else:
            model = path
    chosen = first_shard or model
    if chosen is None:
        return None
    if mmproj is not None:
        sidecars.insert(0, "mmproj")
    return ModelEntry(name=folder.name, source="models_dir", model=str(chosen),
                      local_path=str(chosen), mmproj=str(mmproj) if mmproj else None,
                      sidecars=sorted(set(sidecars), key=SIDECAR_KINDS.index))


def _cache_models(cache: Path) -> dict[str, ModelEntry]:
    """Hugging Face cache folders `models--user--repo/snapshots/<rev>/*.gguf`, named as
    llama.cpp names cached models (`user/repo:TAG`, the tag from the file name)."""
    entries: dict[str, ModelEntry] = {}
    if not cache.is_dir():
        return entries
    for repo_dir in sorted(cache.glob("models--*--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        files = sorted(p for p in (repo_dir / "snapshots").glob("*/**/*.gguf") if p.exists())
        mmproj = next((p for p in files if _is_mmproj(p.name)), None)
        for path in files:
            tag, part = file_tag(path.name)
            if not is_model_file(path.name) or part != 1:
                continue
            name = f"{repo}:{tag}" if tag else repo
            snapshot = next(p for p in path.parents if p.parent.name == "snapshots")
            entries[name] = ModelEntry(
                name=name, source="cache", hf_repo=name,
                hf_file=path.relative_to(snapshot).as_posix(), local_path=str(path),
                mmproj=str(mmproj) if mmproj else None,
                sidecars=["mmproj"] if mmproj else [])
    return entries


def _store_models(store: ObjectStore) -> dict[str, ModelEntry]:
    """The object store's models, named as storage/model_catalog.py names them: Hub files
    (`POST /models`, a worker's -hf) as `user/repo:TAG`, pushed files as `NAME.gguf`."""
    try:
        stored = list_stored_models(store)
    except StorageError as exc:
        log.warning("cannot list the models in the object store: %s", exc)
        return {}
    entries: dict[str, ModelEntry] = {}
    for model in stored:
        if model.source == "hf":
            entry = ModelEntry(name=model.name, source="cache", hf_repo=model.name)
        elif is_model_file(model.name):  # not a projector or draft pushed on its own
            entry = ModelEntry(name=model.name, source="store", model=model.name)
        else:
            continue
        entry.sidecars = [k for k in SIDECAR_KINDS if k in model.sidecars]
        entries[model.name] = entry
    return entries


# -- presets ----------------------------------------------------------------------------


def read_preset(path: Path) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The `[*]` options and each section's options of a preset INI file."""
    parser = configparser.ConfigParser(interpolation=None, strict=False,
                                       comment_prefixes=(";", "#"), inline_comment_prefixes=None,
                                       default_section="\x00none")
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    try:
        text = path.read_text()
    except OSError as exc:
        raise CatalogError(f"--models-preset {path}: {exc.strerror}") from None
    try:  # keys before the first section (`version = 1`) go to a section of their own
        parser.read_string("[\x00top]\n" + text)
    except configparser.Error as exc:
        raise CatalogError(f"--models-preset {path}: {exc}") from None
    sections = {name: {k.strip(): v.strip() for k, v in parser[name].items()}
                for name in parser.sections() if name != "\x00top"}
    return sections.pop("*", {}), sections


def _apply_preset(entries: dict[str, ModelEntry], path: Path) -> None:
    global_options, sections = read_preset(path)
    for name, own in sections.items():
        options = {**global_options, **own}
        entry = entries.get(name)
        model = _pop(options, _MODEL_KEYS)
        hf_repo = _pop(options, _HF_REPO_KEYS)
        hf_file = _pop(options, _HF_FILE_KEYS)
        if entry is None:
            if not model and not hf_repo:
                raise CatalogError(f"--models-preset {path}: [{name}] names no known model; "
                                   "give `model` or `hf-repo`")
            entry = ModelEntry(name=name, source="preset")
        entry.source = "preset"
        if model:
            resolved = Path(model).expanduser()
            entry.model = str(resolved.resolve()) if resolved.exists() else model
            entry.local_path = entry.model if resolved.is_file() else None
        if hf_repo:
            entry.hf_repo, entry.model = hf_repo, model or None
        if hf_file:
            entry.hf_file = hf_file
        if mmproj := _pop(options, _MMPROJ_KEYS):
            entry.mmproj = mmproj
            entry.sidecars = sorted({*entry.sidecars, "mmproj"}, key=SIDECAR_KINDS.index)
        entry.aliases = _split(_pop(options, _ALIAS_KEYS))
        entry.tags = _split(_pop(options, _TAGS_KEYS))
        for key in _RESERVED_KEYS:
            options.pop(key, None)
        entry.load_on_startup = _truthy(options.pop("load-on-startup", ""))
        stop = options.pop("stop-timeout", "")
        entry.stop_timeout_s = int(stop) if stop.strip().isdigit() else None
        dedup = _truthy(options.pop("dedup-cache-models", ""))
        entry.options = options
        entries[name] = entry
        if dedup and entry.hf_repo:
            cached = entries.get(entry.hf_repo)
            if cached is not None and cached.source == "cache" and cached is not entry:
                cached.hidden = True


def _pop(options: dict[str, str], names: tuple[str, ...]) -> str:
    found = ""
    for name in names:
        value = options.pop(name, None)
        if value is not None:
            found = value
    return found


def _split(value: str) -> list[str]:
    return sorted({part.strip() for part in value.split(",") if part.strip()})


def _truthy(value: str) -> bool:
    return value.strip().lower() in TRUE_WORDS


def _check_aliases(entries: dict[str, ModelEntry]) -> None:
    seen: dict[str, str] = {}
    for entry in entries.values():
        for alias in entry.aliases:
            if alias in entries or alias in seen:
                raise CatalogError(f"alias '{alias}' for model '{entry.name}' conflicts with "
                                   "another model's name or alias")
            seen[alias] = entry.name


# -- architecture ---------------------------------------------------------------------------


def architecture_of(entry: ModelEntry) -> Architecture:
    """The spec's offline `architecture`: output modalities from the model's GGUF metadata,
    input modalities from its projector; ["text"] for both when a file is not readable."""
    arch = Architecture()
    if entry.local_path:
        try:
            arch.output_modalities = output_modalities(read_metadata(Path(entry.local_path)))
        except GgufError as exc:
            log.debug("model %s: %s", entry.name, exc)
    if entry.mmproj:
        try:
            meta = read_metadata(Path(entry.mmproj))
        except GgufError as exc:
            log.debug("model %s: projector: %s", entry.name, exc)
        else:
            if meta.get("clip.has_vision_encoder") or any(k.startswith("clip.vision.")
                                                          for k in meta):
                arch.input_modalities.append("image")
            if meta.get("clip.has_audio_encoder") or any(k.startswith("clip.audio.")
                                                         for k in meta):
                arch.input_modalities.append("audio")
    return arch


def output_modalities(meta: dict[str, int | float | bool | str]) -> list[str]:
    """What a model produces, from its metadata: "decisions" for a native decision model
    (llamaq's decision keys or a family of the spec, scheduler/decision_meta.py), else
    ["text"]."""
    return metadata_output_modalities(meta)
