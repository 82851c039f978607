"""A step as data: which runs go, and which tokens of theirs fill the batch (vLLM's
SchedulerOutput is the model). Pure: no llama.cpp, no engine state; the engine builds the
RunStates, asks for a StepPlan and fills the batch from it (worker/engine/loop.py).

The rules are llama-server's (update_slots), plus ours for batch lines:
- a generating run puts its sampled token first, then its draft (speculative decoding);
- prompt tokens follow, online runs' before batch lines', each part in slot order (without a
  unified KV cache llama.cpp puts only consecutive sequence ids in one ubatch); the online
  prompt budget goes by priority first (a lower value first, then slot order: ours);
- batch lines (background jobs) sit the step out while an online prompt is evaluated, and their
  prompts take at most `background_budget` tokens (DecodeSpeed), so an online request that
  arrives meanwhile waits little.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from worker.engine.admission import prompt_chunks


@dataclass(frozen=True)
class RunState:
    """What planning reads of a run on a slot."""

    slot_id: int
    prefilling: bool
    background: bool
    prompt_done: int
    """Prompt tokens already in the slot's cache."""
    prompt_end: int = 0
    """How far its prompt may go this step (its next media chunk, a checkpoint cut, the KV
    tier's boundary); only read while prefilling."""
    n_draft: int = 0
    """Draft tokens after its sampled token (generating runs)."""
    priority: int = 0
    """Its job's priority: a prefill of a lower value gets the step's prompt budget first."""


@dataclass(frozen=True)
class PromptChunk:
    """Prompt tokens [start, end) of the run on `slot_id`, in this step's batch."""

    slot_id: int
    start: int
    end: int


@dataclass(frozen=True)
class StepPlan:
    generate: tuple[int, ...]
    """Slots whose sampled token (and draft) go first, in slot order."""
    prompts: tuple[PromptChunk, ...]
    """Then these prompt chunks, in order; a run with none this step has no chunk."""
    n_tokens: int
    """The batch's size."""


def runs_that_go(runs: Sequence[RunState]) -> list[RunState]:
    """The runs of a step: all of them, but batch lines while an online prompt is evaluated."""
    if any(r.prefilling and not r.background for r in runs):
        return [r for r in runs if not r.background]
    return list(runs)


def by_priority(runs: list[RunState], share: Callable[[list[RunState]], list[int]]
                ) -> list[int]:
    """`share`'s answer for `runs` taken by priority (then slot order), given back in slot
    order: the budget goes to the more urgent prompts first, the batch keeps slot order."""
    order = sorted(range(len(runs)), key=lambda i: runs[i].priority)
    shared = share([runs[i] for i in order])
    ends = [0] * len(runs)
    for i, end in zip(order, shared, strict=True):
        ends[i] = end
    return ends


def plan_step(runs: Sequence[RunState], n_batch: int, background_budget: int) -> StepPlan:
    """The step's batch for `runs` (those that go, in slot order)."""
    generate = [r for r in runs if not r.prefilling]
    n = sum(1 + r.n_draft for r in generate)
    online = [r for r in runs if r.prefilling and not r.background]
    background = [r for r in runs if r.prefilling and r.background]
    ends = by_priority(online, lambda runs: prompt_chunks(
        n, [(r.prompt_done, r.prompt_end) for r in runs], n_batch))
    n_online = n + sum(end - r.prompt_done for r, end in zip(online, ends, strict=True))
    ends += prompt_chunks(0, [(r.prompt_done, r.prompt_end) for r in background],
                          min(n_batch - n_online, background_budget))
    prompts = tuple(PromptChunk(r.slot_id, r.prompt_done, end)
                    for r, end in zip([*online, *background], ends, strict=True)
                    if end > r.prompt_done)
    n_tokens = n + sum(c.end - c.start for c in prompts)
    return StepPlan(tuple(r.slot_id for r in generate), prompts, n_tokens)
