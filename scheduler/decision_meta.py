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
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from scheduler.gguf_meta import GgufError, read_metadata

log = logging.getLogger(__name__)

KEY_PREFIX = "llamaq.decision."
TYPES_KEY = "llamaq.decision.types"
TEMPERATURE_KEY = "llamaq.decision.temperature."
MAX_OPTIONS_KEY = "llamaq.decision.max_options"
QuestionType = Literal["choice", "score", "noul"]
QUESTION_TYPES: tuple[QuestionType, ...] = ("choice", "score", "noul")
DEFAULT_MAX_OPTIONS = 255
"""The option limit of prompted models, as the spec gives it for most native ones."""


class DecisionMetaError(ValueError):
    """A llamaq decision key with a value that cannot be used (the model does not start)."""


class DecisionCaps(BaseModel):
    """How a worker serves /v1/systemone (published with its model's metadata)."""

    mode: Literal["native", "prompted"]
    types: list[QuestionType] = Field(default_factory=lambda: list(QUESTION_TYPES))
    max_options: int = DEFAULT_MAX_OPTIONS
    temperatures: dict[str, float] = Field(default_factory=dict)
    """By question type; a type not listed has temperature 1."""

    def temperature(self, question_type: str) -> float:
        return self.temperatures.get(question_type, 1.0)


def native_caps(metadata: dict[str, Any]) -> DecisionCaps | None:
    """The decision capabilities a GGUF's metadata declares; None when it declares none.
    Raises DecisionMetaError for a key whose value is unusable."""
    raw_types = metadata.get(TYPES_KEY)
    if raw_types is None:
        return None
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
    """The spec's `output_modalities`: "decisions" for a native decision model only (it can
    generate text as well: llama.cpp loads it as a language model)."""
    if caps is not None and caps.mode == "native":
        return ["text", "decisions"]
    return ["text"]


def file_output_modalities(path: Path) -> list[str]:
    """`output_modalities` computed offline from a GGUF file's header (no load, no download);
    ["text"] when the file or its metadata cannot be read, as the spec says."""
    try:
        return output_modalities(native_caps(read_metadata(path)))
    except (OSError, GgufError, DecisionMetaError) as error:
        log.debug("no decision metadata read from %s: %s", path.name, error)
        return ["text"]
