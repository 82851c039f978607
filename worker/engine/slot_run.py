"""One request while it holds a slot (llama-server's server_slot, for one task).

Owns: the run's progress through its prompt and generation, its timings (as llama-server
times them) and its progress events. Touched by the engine thread only, except that slot
reports read plain attributes from another thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from scheduler.contract.results import (
    GenerationSettings,
    PromptProgress,
    Timings,
    TokenEvent,
    TokenProbs,
)
from worker.engine.reasoning import ReasoningTracker
from worker.engine.requests import Request
from worker.engine.textstream import TextStream
from worker.kv.slots import SlotCache


@dataclass
class SlotRun:
    request: Request
    slot: SlotCache
    text: TextStream
    task_no: int
    n_cached: int
    t_start: float
    prompt_done: int = 0
    next_token: int = -1
    batch_index: int = -1
    generated: list[int] = field(default_factory=list)
    t_prompt_done: float = 0.0
    """When the first token was sampled (the prompt's end, as llama-server times it)."""
    t_prompt_last: float = 0.0
    """When the last decode with prompt tokens of this request ended."""
    last_prompt_index: int = -1
    """Batch index of this step's last prompt token of the request (-1: none)."""
    has_new_line: bool = False
    truncated: bool = False
    line_start: int = 0
    reasoning: ReasoningTracker | None = None
    probs: list[TokenProbs] = field(default_factory=list)
    settings: GenerationSettings | None = None
    """Its generation_settings, made once (slot reports read them on every change)."""
    earlier_predicted_ms: float = 0.0
    """A continuation's generation time on the workers before (scheduler/migration.py)."""
    draft_n: int = 0
    draft_n_accepted: int = 0
    """Speculative decoding: tokens drafted for the run, and how many the target accepted
    (worker/engine/verify.py)."""

    @classmethod
    def begin(cls, request: Request, slot: SlotCache, task_no: int, n_cached: int) -> SlotRun:
        """The run of `request` on `slot`, whose cache holds its first `n_cached` tokens."""
        spec = request.job.reasoning
        return cls(request, slot, TextStream(request.stop), task_no, n_cached=n_cached,
                   t_start=time.perf_counter(), prompt_done=n_cached,
                   reasoning=ReasoningTracker.start(spec) if spec else None)

    @property
    def prefilling(self) -> bool:
        return self.prompt_done < len(self.request.prompt_tokens)

    def timings(self, now: float) -> Timings:
        """llama-server's timings: the prompt is timed until its first token is sampled; that
        token costs no decode step, so the generation rates are over n - 1 steps."""
        prompt_n = self.prompt_done - self.n_cached
        prompt_ms = (self.t_prompt_last - self.t_start) * 1000 if self.t_prompt_last else 0.0
        media = self.request.media
        # encoded before the slot started (worker/runtime/media.py)
        if media is not None and prompt_ms:
            prompt_ms += media.encode_ms
        predicted_n = len(self.generated)
        steps = max(0, predicted_n - 1)
        predicted_ms = self.earlier_predicted_ms + (
            max(0.001, (now - self.t_prompt_done) * 1000) if self.t_prompt_done else 0.0)
        if not predicted_n:
            predicted_ms = 0.0
        return Timings(
            cache_n=self.n_cached,
            prompt_n=prompt_n,
            prompt_ms=prompt_ms,
            prompt_per_token_ms=prompt_ms / prompt_n if prompt_n else 0.0,
            prompt_per_second=prompt_n * 1000 / prompt_ms if prompt_ms else 0.0,
            predicted_n=predicted_n,
            predicted_ms=predicted_ms,
            predicted_per_token_ms=predicted_ms / steps if steps else 0.0,
            predicted_per_second=steps * 1000 / predicted_ms if predicted_ms else 0.0,
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
        )

    def progress(self, now: float) -> TokenEvent:
        """A prompt_progress event (with the timings so far under timings_per_token)."""
        timings = self.timings(now) if self.request.job.timings_per_token else None
        progress = PromptProgress(total=len(self.request.prompt_tokens), cache=self.n_cached,
                                  processed=self.prompt_done,
                                  time_ms=int((now - self.t_start) * 1000))
        return TokenEvent(content="", tokens=[], timings=timings, progress=progress,
                          n_decoded=len(self.generated),
                          n_prompt_tokens=self.request.n_prompt)
