"""/metrics: llama-server's Prometheus metrics, summed over the model's workers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.registry import WorkerMetrics

PREFIX = "llamacpp:"
OURS = "llamaq:"
CONTENT_TYPE = "text/plain; version=0.0.4"


@dataclass(frozen=True)
class QueueStats:
    """The model's jobs in Redis, for autoscalers (see scheduler/leases.py)."""

    depth: int = 0
    """Jobs that wait for a worker (in the model's queue and its workers' own queues)."""
    oldest_s: float = 0.0
    retried: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    """Failed jobs by cause (worker_died, poison, drain_timeout)."""


class FleetCollector(Collector):
    def __init__(self, workers: list[WorkerMetrics], queue: QueueStats) -> None:
        self._workers = workers
        self._queue = queue

    def collect(self) -> Iterator[Metric]:
        def total(field: str) -> float:
            return float(sum(getattr(w, field) for w in self._workers))

        prompt_s, predicted_s = total("prompt_seconds_total"), total(
            "tokens_predicted_seconds_total")
        decodes = total("n_decode_total")
        counters = [
            ("prompt_tokens", "Number of prompt tokens processed.", total("prompt_tokens_total")),
            ("prompt_seconds", "Prompt process time", prompt_s),
            ("tokens_predicted", "Number of generation tokens processed.",
             total("tokens_predicted_total")),
            ("tokens_predicted_seconds", "Predict process time", predicted_s),
            ("n_decode", "Total number of llama_decode() calls", decodes),
        ]
        for name, help_text, value in counters:
            yield CounterMetricFamily(PREFIX + name, help_text, value=value)
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
             total("prompt_tokens_total") / prompt_s if prompt_s else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
             total("tokens_predicted_total") / predicted_s if predicted_s else 0.0),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             total("n_busy_slots_total") / decodes if decodes else 0.0),
            ("requests_processing", "Number of requests processing.",
             total("requests_processing")),
            ("requests_deferred", "Number of requests deferred.",
             total("requests_deferred") + self._queue.depth),
            ("n_tokens_max", "Largest observed n_tokens.",
             float(max((w.n_tokens_max for w in self._workers), default=0))),
        ]
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, help_text, value=value)
        yield from self._ours()

    def _ours(self) -> Iterator[Metric]:
        queue = self._queue
        yield GaugeMetricFamily(OURS + "queue_depth", "Jobs waiting in Redis for a worker.",
                                value=queue.depth)
        yield GaugeMetricFamily(OURS + "queue_oldest_seconds",
                                "How long the oldest waiting job has waited.",
                                value=queue.oldest_s)
        yield CounterMetricFamily(OURS + "jobs_retried", "Jobs run again after their worker "
                                  "died before they sent anything.", value=queue.retried)
        failed = CounterMetricFamily(OURS + "jobs_failed", "Jobs ended by a fault, by cause.",
                                     labels=["cause"])
        for cause in ("worker_died", "poison", "drain_timeout"):
            failed.add_metric([cause], queue.failed.get(cause, 0))
        yield failed


def render_metrics(workers: list[WorkerMetrics], queue: QueueStats | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(workers, queue or QueueStats()))
    return generate_latest(registry)
