"""The spec's native decision families (its "POST /v1/systemone" section) and their rules.

A family's GGUF names it in `<general.architecture>.decision.type` (llama.cpp's
`common_get_decision_type`, common/common.cpp; its server reads the rest in
tools/server/server-decision.cpp). The names below are the values llama.cpp matches; the
sources are in docs/models.md ("Native decision models"). A name the spec lists whose GGUF
identification is published nowhere we could find is refused by name (REFUSED_FAMILIES), and so
are the families llama.cpp knows that the spec does not list.

`readout` says where an answer is read: "label-logits" (the logits of one label token per option
at the last prompt token: a language model, which llamaq's engine runs) or "head" (a decision
head's scores from the embeddings output: llama.cpp's decision head graphs, which the llama.cpp
that llama-cpp-python bundles does not have; such a model is recognised and its requests are
checked, then answered 501, see worker/decisions/plan.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from scheduler.contract.deferred import DeferredModel


class FamilyRules(DeferredModel):
    """What the spec (and llama.cpp) says of one family."""

    model_config = ConfigDict(frozen=True)

    name: str
    readout: Literal["label-logits", "head"]
    max_options: int = 255
    """The most options of a choice question (the spec: 52 for openjev, 255 for the others)."""
    one_batch: bool = False
    """The whole prompt is evaluated in one batch: it must fit in --ubatch-size."""
    prompt_cap: int | None = None
    """Tokens a prompt is cut to (lfm2-d1-omni: 16384, its max_length)."""
    joint: bool = False
    """All the questions of a request are read in one prompt and decided jointly (clef)."""
    decisions_only: bool = False
    """Serves only /v1/systemone: text generation is not available (clef)."""
    null_state: bool = False
    """`state` may be null (lfm2-d1, lfm2-d1-omni)."""
    head_budget: bool = False
    """Questions and options are cut to `<arch>.decision.max_head_tokens` (laya)."""
    output_modalities: tuple[str, ...] = ("decisions",)
    """The spec's `output_modalities` (a decision model that is also a text model:
    ("text", "decisions"))."""


FAMILIES: dict[str, FamilyRules] = {rules.name: rules for rules in (
    FamilyRules(name="openjev", readout="label-logits", max_options=52),
    FamilyRules(name="pplx-decider", readout="label-logits"),
    FamilyRules(name="lfm2-d1", readout="label-logits", null_state=True),
    FamilyRules(name="laya", readout="head", one_batch=True, head_budget=True),
    FamilyRules(name="clef", readout="head", one_batch=True, joint=True, decisions_only=True),
    FamilyRules(name="lfm2-d1-omni", readout="head", one_batch=True, prompt_cap=16384,
                null_state=True),
)}
"""The families the spec names whose GGUF identification is published (docs/models.md)."""

NOT_PUBLISHED = ("the spec names this family, but no public source (llama.cpp and its forks, "
                 "converters, model cards, Ollama) says how its GGUF identifies itself, so "
                 "llamaq cannot recognise it and refuses it by name")
NOT_IN_SPEC = ("llama.cpp knows this family, but the spec's /v1/systemone section does not "
               "list it, so llamaq does not serve it")
REFUSED_FAMILIES: dict[str, str] = {
    "granite-switch": NOT_PUBLISHED,
    "vllm-decision2": NOT_PUBLISHED,
    "vllm-d3": NOT_PUBLISHED,
    "lev": NOT_IN_SPEC,
    "kev": NOT_IN_SPEC,
    "nimble": NOT_IN_SPEC,
    "d1": ("the name the first d1-3B quants carried before llama.cpp renamed the type "
           "lfm2-d1; llama.cpp refuses it too: use a GGUF that says lfm2-d1"),
}
"""`<arch>.decision.type` values a worker refuses to serve, and why (named in its error)."""
