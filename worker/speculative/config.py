"""What the worker's speculative flags configure (llama.cpp's common_params_speculative).

Owns: the draft types and their names (`--spec-type` comma lists, `none`), each mode's
parameters and their defaults, `--spec-default`, and the largest draft a configuration can
propose (common_speculative_n_max).
"""

from __future__ import annotations

from pydantic import Field

from scheduler.contract.deferred import DeferredModel

TYPE_NAMES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash",
              "draft-dspark", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
              "ngram-cache")
"""llama.cpp's speculative types, in the order of its enum (common_speculative_type)."""
BUILT = frozenset({"none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                   "ngram-mod", "ngram-cache"})
"""The types llamaq drafts with."""
NOT_LOADABLE = {
    "draft-eagle3": "EAGLE-3 draft heads",
    "draft-mtp": "multi-token-prediction heads",
    "draft-dflash": "DFlash draft heads",
    "draft-dspark": "DSpark draft heads",
}
"""Types that need model families llama-cpp-python cannot load, and what they need."""
PRIORITY = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
            "draft-simple")
"""The order llama.cpp asks its drafters in (common_speculative_init): the first that drafts
for a sequence wins."""


class UnknownSpecType(ValueError):
    pass


def types_from_names(names: list[str]) -> list[str]:
    """llama.cpp's common_speculative_types_from_names: `none` anywhere means none at all."""
    types: list[str] = []
    for name in names:
        if name not in TYPE_NAMES:
            raise UnknownSpecType(f"unknown speculative type: {name}")
        if name == "none":
            return ["none"]
        types.append(name)
    return types


def refusal(types: list[str]) -> str | None:
    """Why llamaq cannot draft with `types` (None: it can)."""
    for name in types:
        if name in NOT_LOADABLE:
            return (f"--spec-type {name} is not supported by llamaq: it needs "
                    f"{NOT_LOADABLE[name]}, a model family llama-cpp-python cannot load")
        if name not in BUILT:
            return f"--spec-type {name} is not supported by llamaq: it is not built"
    return None


class NgramModParams(DeferredModel):
    """--spec-ngram-mod-*: common_params_speculative_ngram_mod."""

    n_match: int = 24
    n_max: int = 64
    n_min: int = 48


class NgramMapParams(DeferredModel):
    """--spec-ngram-simple-*, --spec-ngram-map-k-*, --spec-ngram-map-k4v-*:
    common_params_speculative_ngram_map."""

    size_n: int = 12
    size_m: int = 48
    min_hits: int = 1


class DraftParams(DeferredModel):
    """--spec-draft-*: common_params_speculative_draft (draft-simple's part)."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    p_split: float = 0.1
    """Kept as llama-server keeps it: draft-simple does not read it (nor does llama.cpp's)."""


class SpecConfig(DeferredModel):
    """A worker's speculative decoding (its flags, resolved)."""

    types: list[str] = Field(default_factory=lambda: ["none"])
    """As llama-server keeps them: the default `none`, then what --spec-type (each time it
    is given) and --spec-default added, in that order."""
    ngram_mod: NgramModParams = Field(default_factory=NgramModParams)
    ngram_simple: NgramMapParams = Field(default_factory=NgramMapParams)
    ngram_map_k: NgramMapParams = Field(default_factory=NgramMapParams)
    ngram_map_k4v: NgramMapParams = Field(default_factory=NgramMapParams)
    draft: DraftParams = Field(default_factory=DraftParams)
    draft_model: str | None = None
    """-md/--spec-draft-model: the draft model's file (draft-simple drafts with it)."""
    lookup_cache_static: str | None = None
    lookup_cache_dynamic: str | None = None
    """-lcs/--lookup-cache-static, -lcd/--lookup-cache-dynamic: llama.cpp's n-gram cache files
    ngram-cache drafts with (worker/speculative/ngram_cache.py). -lcs is read only, as in
    llama-server; -lcd is read at start, grown by the requests' tokens and saved and shared
    through the object store (worker/speculative/lookup_share.py), where llama-server never
    writes it."""
    synth_len: float | None = None
    synth_rates: list[float] = Field(default_factory=list)
    """--spec-synth-len, --spec-synth-rates (worker/speculative/synthetic.py)."""

    @property
    def drafting(self) -> list[str]:
        """The types that draft, in llama.cpp's priority order."""
        return [t for t in PRIORITY if t in self.types]

    @property
    def enabled(self) -> bool:
        return bool(self.drafting)

    def name_str(self) -> str:
        """`speculative.types` of a result's generation_settings
        (common_speculative_type_name_str): every type, `none` included, comma-separated."""
        return ",".join(self.types)

    def n_max(self) -> int:
        """The largest draft of any enabled mode (common_speculative_n_max)."""
        sizes = {"ngram-simple": self.ngram_simple.size_m,
                 "ngram-map-k": self.ngram_map_k.size_m,
                 "ngram-map-k4v": self.ngram_map_k4v.size_m,
                 "ngram-mod": max(0, self.ngram_mod.n_max), "ngram-cache": 8,
                 "draft-simple": self.draft.n_max}
        return max((sizes.get(t, 0) for t in self.drafting), default=0)


def resolve(spec_types: list[str], spec_default: bool, ngram_mod: NgramModParams,
            ngram_simple: NgramMapParams, ngram_map_k: NgramMapParams | None = None,
            ngram_map_k4v: NgramMapParams | None = None) -> SpecConfig:
    """The flags as llama-server applies them: each --spec-type list appends its types to the
    default `none` (a `none` in a list adds only `none`), --spec-default appends ngram-mod
    with n_match 24, n_min 48, n_max 64 (after the command line's, as its handler runs last
    for a flag given after them; llamaq applies it last whatever the order)."""
    types = ["none"]
    for value in spec_types:
        types += types_from_names([n for n in value.split(",")])
    if spec_default:
        types.append("ngram-mod")
        ngram_mod = NgramModParams(n_match=24, n_min=48, n_max=64)
    return SpecConfig(types=types, ngram_mod=ngram_mod, ngram_simple=ngram_simple,
                      ngram_map_k=ngram_map_k or NgramMapParams(),
                      ngram_map_k4v=ngram_map_k4v or NgramMapParams())
