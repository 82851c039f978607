"""Time to first token and inter-token latency (ours): Prometheus histograms per model, as the
api pod sees a stream's tokens, which is how its client sees them.

- `llamaq:time_to_first_token_seconds{model}`: from the job's submission (the request parsed
  and rendered, before any wait in the queues or for a cold start) to its first generated token;
- `llamaq:inter_token_latency_seconds{model}`: the time between a stream's token events, per
  token: an event that brings k tokens (--stream-interval coalescing, speculative decoding)
  counts k tokens of gap/k each, so the mean is the stream's time per output token.

Only streamed completions are timed: a non-streamed one has no first token its client sees
(its `timings` carry the worker's prompt and generation times). Each api pod counts in
process, one bisect and a few additions per event, no Redis: Prometheus adds the pods up
(`sum by (model, le) (rate(…_bucket[5m]))` under `histogram_quantile`).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scheduler.contract.results import FinalEvent, StartedEvent, TokenEvent

OURS = "llamaq:"
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                  40.0, 80.0, 160.0, 320.0, 640.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0)
OnEvent = Callable[[TokenEvent | FinalEvent | StartedEvent], Awaitable[None]]


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    """Per bucket (not cumulative), the last one past every bound (+Inf)."""
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def lines(self, name: str, model: str) -> list[str]:
        label = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out, running = [], 0
        for bound, count in zip((*self.bounds, None), self.counts, strict=True):
            running += count
            le = "+Inf" if bound is None else f"{bound:g}"
            out.append(f'{OURS}{name}_bucket{{model="{label}",le="{le}"}} {running}')
        total = str(int(self.total)) if float(self.total).is_integer() else repr(self.total)
        out += [f'{OURS}{name}_sum{{model="{label}"}} {total}',
                f'{OURS}{name}_count{{model="{label}"}} {self.count}']
        return out


@dataclass
class ModelLatency:
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))


class Latency:
    """This pod's histograms, per model."""

    def __init__(self) -> None:
        self._models: dict[str, ModelLatency] = {}

    def of(self, model: str) -> ModelLatency:
        found = self._models.get(model)
        if found is None:
            found = self._models[model] = ModelLatency()
        return found

    def watch(self, model: str, then: OnEvent | None) -> OnEvent:
        """An `on_event` (scheduler/job_events.py) that times a stream's tokens, then calls
        `then`."""
        histograms = self.of(model)
        last: float | None = None
        submitted = time.monotonic()

        async def on_event(event: TokenEvent | FinalEvent | StartedEvent) -> None:
            nonlocal last
            if isinstance(event, TokenEvent) and event.tokens:
                now = time.monotonic()
                if last is None:
                    histograms.ttft.observe(now - submitted)
                else:
                    n = len(event.tokens)
                    histograms.itl.observe((now - last) / n, n)
                last = now
            if then is not None:
                await then(event)

        return on_event

    def lines(self, models: list[str]) -> list[str]:
        """The two families, a series for each of `models` (0 before its first stream) and
        each other model this pod timed."""
        names = sorted({*models, *self._models})
        items = [(m, self._models.get(m) or ModelLatency()) for m in names]
        out = [f"# HELP {OURS}time_to_first_token_seconds From a streamed completion's "
               "submission to its first token, as the api pod sees it.",
               f"# TYPE {OURS}time_to_first_token_seconds histogram"]
        for model, item in items:
            out += item.ttft.lines("time_to_first_token_seconds", model)
        out += [f"# HELP {OURS}inter_token_latency_seconds Time between a stream's tokens, "
                "as the api pod sees them.",
                f"# TYPE {OURS}inter_token_latency_seconds histogram"]
        for model, item in items:
            out += item.itl.lines("inter_token_latency_seconds", model)
        return out
