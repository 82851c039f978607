"""What models the object store holds, named the way a client asks for them: Hub files as
`<user>/<repo>:<TAG>` (llama.cpp's cached-model names: the tag from the file name, one entry
per quant, split parts and sidecars folded in), pushed files as `NAME.gguf` (`-m NAME.gguf`).
For the router's GET /models; computed from key names only (no download)."""

import re
from dataclasses import dataclass
from typing import Literal

from storage.base import ObjectStore
from storage.checksum import CHECKSUM_SUFFIX
from storage.hf import SIDECAR_KEYWORDS, is_model_file, pick_sidecar, split_parts
from storage.models import HF_PREFIX, MODELS_PREFIX, URL_PREFIX

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class StoredModel:
    name: str
    source: Literal["hf", "pushed"]
    keys: tuple[str, ...]
    """The model's file keys (every part of a split GGUF, first part first)."""
    sidecars: tuple[str, ...] = ()
    """The sidecar kinds stored with it (mmproj, mtp, dflash, eagle3, dspark)."""


def file_tag(path: str) -> tuple[str, int]:
    """(TAG, part index) of a GGUF file name, as llama.cpp reads them; TAG may be empty."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".gguf")
    index = 1
    if split := _SPLIT.match(stem):
        stem, index = split["prefix"], int(split["index"])
    tag = _TAG.search(stem)
    return (tag[1].upper() if tag else ""), index


def list_stored_models(store: ObjectStore) -> list[StoredModel]:
    keys = [k for k in store.list_keys(MODELS_PREFIX) if not k.endswith(CHECKSUM_SUFFIX)]
    repos: dict[str, list[str]] = {}
    found: list[StoredModel] = []
    for key in keys:
        if key.startswith(HF_PREFIX):
            parts = key.removeprefix(HF_PREFIX).split("/", 2)
            if len(parts) == 3:
                repos.setdefault(f"{parts[0]}/{parts[1]}", []).append(parts[2])
        elif not key.startswith(URL_PREFIX) and key.endswith(".gguf"):
            found.append(StoredModel(key.removeprefix(MODELS_PREFIX), "pushed", (key,)))
    for repo_id, paths in sorted(repos.items()):
        found.extend(_repo_models(repo_id, sorted(paths)))
    return sorted(found, key=lambda m: m.name)


def _repo_models(repo_id: str, paths: list[str]) -> list[StoredModel]:
    models: dict[str, StoredModel] = {}
    for path in paths:
        tag, index = file_tag(path)
        name = f"{repo_id}:{tag}"
        if not is_model_file(path) or index != 1 or not tag or name in models:
            continue
        members = split_parts(paths, path)
        if any(p not in paths for p in members):
            continue  # an incomplete split: not loadable
        kinds = tuple(k for k in SIDECAR_KEYWORDS if pick_sidecar(paths, path, k, tag))
        prefix = f"{HF_PREFIX}{repo_id}/"
        models[name] = StoredModel(name, "hf", tuple(prefix + p for p in members), kinds)
    return list(models.values())
