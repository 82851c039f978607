"""What makes a model a native decision model, and what a worker serves /v1/systemone with.

The spec names no GGUF key for this, so llamaq defines its own (README "Decisions"):

- `llamaq.decision.types` (string): the question types the model was made for, comma-separated
  (`choice,score,noul`); its presence makes the model a native decision model;
- `llamaq.decision.temperature.choice` (`.score`, `.noul`) (float32 > 0): the temperature the
  restricted softmax of that type is scaled with (default 1);
- `llamaq.decision.max_options` (uint32): the most options a choice question may have
  (default 255).

A model without the key serves decisions only under the worker's `--decisions` (prompted): it
reads the same logits the same way, with temperature 1 and 255 options at most, and does not
advertise "decisions" in its output modalities (the spec keeps that for native models).

The spec's families identify themselves as llama.cpp reads them (`common_get_decision_type`):
`<general.architecture>.decision.type` names the family (`lfm2.decision.type = "lfm2-d1"`),
`<arch>.decision.temperature.<type>[.<bucket>]` holds its fitted temperatures, and laya carries
`<arch>.decision.max_head_tokens`. What each family is and what llamaq does with it is
scheduler/decision_families.py.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from scheduler.contract.deferred import DeferredModel
from scheduler.decision_families import FAMILIES, REFUSED_FAMILIES, FamilyRules
from scheduler.gguf_meta import GgufError, read_metadata

log = logging.getLogger(__name__)

KEY_PREFIX = "llamaq.decision."
TYPES_KEY = "llamaq.decision.types"
TEMPERATURE_KEY = "llamaq.decision.temperature."
MAX_OPTIONS_KEY = "llamaq.decision.max_options"
SYSTEMONE_TEMPLATE_KEY = "tokenizer.chat_template.systemone"
QuestionType = Literal["choice", "score", "noul"]
QUESTION_TYPES: tuple[QuestionType, ...] = ("choice", "score", "noul")
DEFAULT_MAX_OPTIONS = 255
"""The option limit of prompted models, as the spec gives it for most native ones."""


class DecisionMetaError(ValueError):
    """A llamaq decision key with a value that cannot be used (the model does not start)."""


class DecisionCaps(DeferredModel):
    """How a worker serves /v1/systemone (published with its model's metadata)."""

    mode: Literal["native", "prompted"]
    types: list[QuestionType] = Field(default_factory=lambda: list(QUESTION_TYPES))
    max_options: int = DEFAULT_MAX_OPTIONS
    temperatures: dict[str, float] = Field(default_factory=dict)
    """By question type, or type and option-count bucket (`choice.3_5`, as llama.cpp fits
    them); a type not listed has temperature 1."""
    family: FamilyRules | None = None
    """The spec's decision family the model file names (None: llamaq's keys, or prompted)."""
    head_tokens: int | None = None
    """laya: the token budget of the question and its options (`max_head_tokens`)."""
    systemone_template: str | None = Field(default=None, exclude=True)
    """A family's `tokenizer.chat_template.systemone` (the worker's own: not published)."""

    def temperature(self, question_type: str, n_options: int = 0) -> float:
        """The bucket's temperature, else the type's, else 1 (llama.cpp's get_temperature)."""
        bucket = ("2" if n_options <= 2 else "3_5" if n_options <= 5
                  else "6_10" if n_options <= 10 else "11")
        for name in (f"{question_type}.{bucket}", question_type):
            if name in self.temperatures:
                return self.temperatures[name]
        return 1.0

    @property
    def accepts_null_state(self) -> bool:
        return self.family is not None and self.family.null_state

    @property
    def serves_text(self) -> bool:
        """False for a family that serves only /v1/systemone (clef)."""
        return self.family is None or not self.family.decisions_only


def decision_type(metadata: dict[str, Any]) -> str | None:
    """`<general.architecture>.decision.type`, llama.cpp's name of a decision model's family
    (None: the file names none)."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return None
    value = metadata.get(f"{arch}.decision.type")
    return value if isinstance(value, str) else None


def family_of(metadata: dict[str, Any]) -> FamilyRules | None:
    """The spec's family a GGUF names; None when it names none. Raises DecisionMetaError for a
    family llamaq refuses (by name, with the reason) or does not know."""
    name = decision_type(metadata)
    if name is None:
        return None
    if name in REFUSED_FAMILIES:
        raise DecisionMetaError(f"decision model type {name!r} is not supported: "
                                f"{REFUSED_FAMILIES[name]}")
    if name not in FAMILIES:
        raise DecisionMetaError(f"unsupported decision model type: {name!r} (llamaq knows "
                                f"{', '.join(FAMILIES)})")
    return FAMILIES[name]


def family_caps(metadata: dict[str, Any], family: FamilyRules) -> DecisionCaps:
    """A family's capabilities: its rules, and the temperatures and budgets of the file."""
    arch = metadata["general.architecture"]
    prefix = f"{arch}.decision.temperature."
    temperatures: dict[str, float] = {}
    for key, raw in metadata.items():
        if not key.startswith(prefix):
            continue
        try:  # llama.cpp reads any value as text, then as a float: "1.15" and 1.15 alike
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise DecisionMetaError(f"invalid decision temperature: {key} = {raw}")
        temperatures[key[len(prefix):]] = value
    head_tokens = None
    if family.head_budget:
        raw = metadata.get(f"{arch}.decision.max_head_tokens")
        try:
            head_tokens = int(raw) if raw is not None and not isinstance(raw, bool) else 0
        except (TypeError, ValueError):
            head_tokens = 0
        if head_tokens <= 0:
            raise DecisionMetaError(f"decision model has no valid {arch}.decision."
                                    f"max_head_tokens ({family.name} needs its token budget)")
    template = metadata.get(SYSTEMONE_TEMPLATE_KEY)
    if not isinstance(template, str) or not template.strip():
        raise DecisionMetaError(f'decision model has no "systemone" template '
                                f"({SYSTEMONE_TEMPLATE_KEY})")
    return DecisionCaps(mode="native", max_options=family.max_options,
                        temperatures=temperatures, family=family, head_tokens=head_tokens,
                        systemone_template=template)


def native_caps(metadata: dict[str, Any]) -> DecisionCaps | None:
    """The decision capabilities a GGUF's metadata declares: llamaq's keys, or a family of the
    spec named by `<arch>.decision.type`; None when it declares none. Raises DecisionMetaError
    for a value that is unusable or a family that is refused."""
    raw_types = metadata.get(TYPES_KEY)
    if raw_types is None:
        family = family_of(metadata)
        return None if family is None else family_caps(metadata, family)
    if not isinstance(raw_types, str):
        raise DecisionMetaError(f"{TYPES_KEY} must be a string such as 'choice,score,noul'")
    types = [t.strip() for t in raw_types.split(",") if t.strip()]
    unknown = [t for t in types if t not in QUESTION_TYPES]
    if not types or unknown:
        raise DecisionMetaError(f"{TYPES_KEY}: unknown question type(s) {unknown or types}; "
                                f"the types are {', '.join(QUESTION_TYPES)}")
    temperatures: dict[str, float] = {}
    for question_type in QUESTION_TYPES:
        value = metadata.get(TEMPERATURE_KEY + question_type)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or value <= 0:
            raise DecisionMetaError(f"{TEMPERATURE_KEY}{question_type} must be a number > 0")
        temperatures[question_type] = float(value)
    max_options = metadata.get(MAX_OPTIONS_KEY, DEFAULT_MAX_OPTIONS)
    if isinstance(max_options, bool) or not isinstance(max_options, int) or max_options < 2:
        raise DecisionMetaError(f"{MAX_OPTIONS_KEY} must be an integer >= 2")
    return DecisionCaps(mode="native", types=types,  # type: ignore[arg-type]
                        max_options=max_options, temperatures=temperatures)


def output_modalities(caps: DecisionCaps | None) -> list[str]:
    """The spec's `output_modalities`: "decisions" for a native decision model only; a family
    gives its own list (["decisions"], as llama-server reports it), llamaq's keys
    ["text", "decisions"] (such a file is a language model that llamaq prompts)."""
    if caps is None or caps.mode != "native":
        return ["text"]
    if caps.family is not None:
        return list(caps.family.output_modalities)
    return ["text", "decisions"]


def metadata_output_modalities(metadata: dict[str, Any]) -> list[str]:
    """`output_modalities` from a GGUF's metadata: a family's from its decision type alone (as
    llama-server reports it, whatever else the file holds), llamaq's keys' when they are
    usable; ["text"] otherwise, a refused or unknown family included (llama-server's answer
    for an unknown type)."""
    try:
        if TYPES_KEY not in metadata:
            family = family_of(metadata)
            return ["text"] if family is None else list(family.output_modalities)
        return output_modalities(native_caps(metadata))
    except DecisionMetaError as error:
        log.debug("unusable decision metadata: %s", error)
        return ["text"]


def file_output_modalities(path: Path) -> list[str]:
    """`output_modalities` computed offline from a GGUF file's header (no load, no download);
    ["text"] when the file or its metadata cannot be read, as the spec says."""
    try:
        metadata = read_metadata(path)
    except (OSError, GgufError) as error:
        log.debug("no decision metadata read from %s: %s", path.name, error)
        return ["text"]
    return metadata_output_modalities(metadata)
