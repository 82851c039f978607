"""The window of llama-server's throughput gauges: `prompt_tokens_seconds` and
`predicted_tokens_seconds` average the work done between two /metrics scrapes (llama-server
resets its buckets at each scrape: the first scrape after work reports it, scrapes while idle
or asleep report 0). In a fleet the window is the model's, whichever pod is scraped: each
worker's totals at the last scrape live in one Redis hash, swapped atomically by a script, so
two pods scraped at once never count one window twice."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.registry import WorkerMetrics

SWAP = """
local n = (#ARGV - 1) / 2
local old = redis.call('HMGET', KEYS[1], unpack(ARGV, 2, n + 1))
redis.call('DEL', KEYS[1])
for i = 2, n + 1 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + n])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return old
"""
"""KEYS[1]: the window; ARGV: its ttl, n worker ids, then their n totals (JSON). The old
totals of those workers; workers gone since leave the window."""


class Throughput(DeferredModel):
    """Work done in one window: tokens and the seconds spent on them."""

    prompt_tokens: int = 0
    prompt_s: float = 0.0
    predicted_tokens: int = 0
    predicted_s: float = 0.0

    @classmethod
    def of(cls, metrics: WorkerMetrics) -> Throughput:
        return cls(prompt_tokens=metrics.prompt_tokens_total,
                   prompt_s=metrics.prompt_seconds_total,
                   predicted_tokens=metrics.tokens_predicted_total,
                   predicted_s=metrics.tokens_predicted_seconds_total)

    def since(self, before: Throughput | None) -> Throughput:
        """The work done since `before` (all of it when the worker restarted since)."""
        if before is None or before.prompt_tokens > self.prompt_tokens \
                or before.predicted_tokens > self.predicted_tokens:
            return self
        return Throughput(prompt_tokens=self.prompt_tokens - before.prompt_tokens,
                          prompt_s=self.prompt_s - before.prompt_s,
                          predicted_tokens=self.predicted_tokens - before.predicted_tokens,
                          predicted_s=self.predicted_s - before.predicted_s)

    def __add__(self, other: Throughput) -> Throughput:
        return Throughput(prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                          prompt_s=self.prompt_s + other.prompt_s,
                          predicted_tokens=self.predicted_tokens + other.predicted_tokens,
                          predicted_s=self.predicted_s + other.predicted_s)

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_tokens / self.predicted_s if self.predicted_s > 0 else 0.0


async def scrape(redis: Redis, model_id: str, workers: dict[str, WorkerMetrics]) -> Throughput:
    """The model's work since the last scrape (of any pod), and a new window from now."""
    if not workers:
        return Throughput()
    now = {worker_id: Throughput.of(metrics) for worker_id, metrics in workers.items()}
    script = redis.register_script(SWAP)
    old = await script(keys=[keys.metrics_window(model_id)],
                       args=[keys.METRICS_WINDOW_TTL_S, *now,
                             *(t.model_dump_json() for t in now.values())])
    window = Throughput()
    for (_, totals), before in zip(now.items(), old, strict=True):
        window += totals.since(Throughput.model_validate(json.loads(before)) if before else None)
    return window
