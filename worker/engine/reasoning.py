"""Reasoning budget and early end: forcing `message + end tag` into a thinking block when its
token budget is spent, or when a client asks for it (/v1/chat/completions/control)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from scheduler.contract.jobs import ReasoningSpec
from worker.runtime.vocab import Vocab


@dataclass
class ReasoningTracker:
    """Where generation stands relative to the thinking block, from the generated text."""

    spec: ReasoningSpec
    inside: bool = False
    done: bool = False
    n_thinking: int = 0
    forced: deque[int] = field(default_factory=deque)
    end_requested: bool = False
    _seen: int = 0
    _body_from: int = 0

    @classmethod
    def start(cls, spec: ReasoningSpec) -> ReasoningTracker:
        return cls(spec, inside=spec.open_at_start)

    def after_token(self, text: str, vocab: Vocab) -> None:
        """Update with the whole generated text after a token (only its new end is scanned);
        queue the forced end when the budget is spent or an end was asked for."""
        spec = self.spec
        if self.done:
            return
        if not self.inside:
            at = text.find(spec.start, max(0, self._seen - len(spec.start)))
            if at != -1:
                self.inside, self._body_from = True, at + len(spec.start)
        if self.inside:
            if text.find(spec.end, max(self._body_from, self._seen - len(spec.end))) != -1:
                self.inside, self.done = False, True
                self.forced.clear()
            else:
                self.n_thinking += 1
        self._seen = len(text)
        self._maybe_force(vocab)

    def request_end(self, vocab: Vocab) -> None:
        self.end_requested = True
        self._maybe_force(vocab)

    def _maybe_force(self, vocab: Vocab) -> None:
        if not self.inside or self.forced:
            return
        over_budget = 0 <= self.spec.budget <= self.n_thinking
        if over_budget or self.end_requested:
            self.forced.extend(vocab.tokenize(self.spec.message + self.spec.end, False, True))

    def next_forced(self) -> int | None:
        return self.forced.popleft() if self.forced else None
