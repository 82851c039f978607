"""The simulator's timing model: how long a prompt takes (uncached tokens at a prefill speed)
and how long until a slot's next token (a mean inter-token latency, slowed by the other
active slots, with a uniform jitter), per step of all generating slots (`batched`, as the real
engine decodes them) or per slot.

Owns: those two durations, as plain functions of the model's parameters. The engine
(worker/simulate/engine.py) decides when to ask.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingModel:
    prefill_tps: float = 4000.0
    """Uncached prompt tokens per second (per slot)."""
    itl_ms: float = 20.0
    """One slot's inter-token latency when it runs alone."""
    itl_jitter: float = 0.0
    """Each latency is uniform within ± this fraction of its mean."""
    batch_slowdown: float = 0.0
    """The latency grows by this fraction per other active slot."""
    batched: bool = True
    """One step gives every generating slot its token at once (the real engine's decode of
    all active slots: one latency drawn per step), rather than a time of its own per slot."""

    def prefill_s(self, uncached: int) -> float:
        """Time to first token: the uncached prompt tokens at the prefill speed."""
        return max(0, uncached) / self.prefill_tps

    def mean_itl_s(self, n_active: int) -> float:
        """The mean inter-token latency with `n_active` slots generating."""
        return self.itl_ms / 1000 * (1 + self.batch_slowdown * max(0, n_active - 1))

    def itl_s(self, n_active: int, rng: random.Random) -> float:
        """One inter-token latency, drawn."""
        mean = self.mean_itl_s(n_active)
        if not self.itl_jitter:
            return mean
        return mean * (1 + rng.uniform(-self.itl_jitter, self.itl_jitter))
