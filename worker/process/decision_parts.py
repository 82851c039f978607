"""A worker's decision parts (/v1/systemone): the caps read from the model file before it
loads, and the family's prompter on the loaded vocabulary."""

from __future__ import annotations

from pathlib import Path

from scheduler.decision_meta import DecisionCaps, DecisionMetaError
from worker.decisions.plan import decision_caps
from worker.decisions.systemone_heads import HeadPrompter
from worker.decisions.systemone_prompt import FamilyPrompter
from worker.runtime.model import LoadedModel, ModelLoadError


def worker_decision_caps(model_path: Path, prompted: bool) -> DecisionCaps | None:
    """How the worker serves /v1/systemone; a decision family it refuses (by name) or unusable
    decision metadata stops it before the model is loaded, with the reason."""
    try:
        return decision_caps(model_path, prompted)
    except DecisionMetaError as error:
        raise ModelLoadError(f"{model_path.name}: {error}") from None


def family_prompter(caps: DecisionCaps | None,
                    model: LoadedModel) -> FamilyPrompter | HeadPrompter | None:
    """A decision family's prompts on the loaded vocabulary; a label that is not a single
    token, a missing marker token, or a template that does not parse, stops the worker."""
    if caps is None or caps.family is None:
        return None
    try:
        if caps.family.readout == "head":
            return HeadPrompter(caps, model.vocab)
        return FamilyPrompter(caps, model.vocab)
    except DecisionMetaError as error:
        raise ModelLoadError(f"{model.path.name}: {error}") from None
