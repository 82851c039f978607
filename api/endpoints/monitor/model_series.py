"""llamaq's per-model series (ours), labelled `{model="…"}`: what autoscalers (KEDA), alerts and
dashboards read (deploy/kubernetes, deploy/grafana).

`/metrics` (llama-server's, one model) carries the autoscaling ones for its model;
`/fleet/metrics` carries them all for every model the pod knows (its own; a router's catalog),
so one scrape of any api pod sees the whole fleet. Each number is read from Redis, so every api
pod reports the same: sum over workers, max over api pods.

- `queue_depth`: jobs that wait for a worker (in the model's queues), including jobs of a
  model that has no worker at all (held by a cold start: api/cold_start.py);
- `queue_oldest_seconds`: how long the oldest of them has waited;
- `requests_running`: jobs in the model's workers' slots;
- `workers{state}`: live workers by state: `idle` (no request), `busy`, `sleeping` (idle sleep,
  its model unloaded); every state is written, 0 included, so "no worker" is a 0, not a gap;
- `cold_start_waiting`, `cold_start_timeouts_total`: requests held now for a model with no
  worker, and those that got no worker within --cold-start-timeout;
- the model's token and job counters (/fleet/metrics only): summed over its live workers, so a
  worker that leaves takes its counts with it (Prometheus's rate() reads the drop as a reset).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.cold_start import cold_counts
from api.fleet import Fleet
from api.queue_stats import QueueStats
from scheduler.registry import WorkerMetrics

OURS = "llamaq:"
WORKER_STATES = ("idle", "busy", "sleeping")
FAULT_CAUSES = ("worker_died", "poison", "drain_timeout")
TOKEN_COUNTERS = (
    ("prompt_tokens_total", "Prompt tokens processed, excluding cached tokens."),
    ("prompt_tokens_cached_total", "Prompt tokens reused from the cache."),
    ("prompt_seconds_total", "Time spent processing prompts."),
    ("tokens_predicted_total", "Tokens generated."),
    ("tokens_predicted_seconds_total", "Time spent generating tokens."),
    ("kv_tier_hits_total", "Prompts whose prefix state was restored from the fleet-wide KV "
     "tier (--kv-store)."),
    ("kv_tier_misses_total", "Prompts that looked the KV tier up and restored nothing from it."),
)


@dataclass(frozen=True)
class ModelSeries:
    model: str
    queue: QueueStats
    workers: dict[str, int] = field(default_factory=dict)
    """Live workers by state (WORKER_STATES)."""
    requests_running: int = 0
    cold_waiting: int = 0
    cold_timeouts: int = 0
    tokens: dict[str, float] = field(default_factory=dict)
    """TOKEN_COUNTERS' totals over the live workers."""


async def model_series(fleet: Fleet, model_id: str) -> ModelSeries:
    workers = await fleet.workers(model_id, fresh=True)
    metrics = await fleet.registry.metrics_by_worker([w.worker_id for w in workers])
    states = dict.fromkeys(WORKER_STATES, 0)
    for worker in workers:
        counts = metrics.get(worker.worker_id, WorkerMetrics())
        states["sleeping" if worker.sleeping else
               "busy" if counts.requests_processing else "idle"] += 1
    waiting, timeouts = await cold_counts(fleet.redis, model_id)
    return ModelSeries(
        model=model_id, queue=await fleet.queue_stats(model_id, workers), workers=states,
        requests_running=sum(m.requests_processing for m in metrics.values()),
        cold_waiting=waiting, cold_timeouts=timeouts,
        tokens={name: float(sum(getattr(m, name) for m in metrics.values()))
                for name, _ in TOKEN_COUNTERS})


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _family(name: str, kind: str, help_text: str,
            samples: list[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {OURS}{name} {help_text}", f"# TYPE {OURS}{name} {kind}"]
    for labels, value in samples:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{OURS}{name}{{{text}}} {_number(value)}")
    return lines


def model_lines(items: list[ModelSeries], full: bool = True) -> list[str]:
    """The per-model families; `full`: with the token and job counters (/fleet/metrics)."""
    def each(attr: str) -> list[tuple[dict[str, str], float]]:
        return [({"model": m.model}, float(getattr(m, attr))) for m in items]

    lines = [
        *_family("queue_depth", "gauge", "Jobs waiting in Redis for a worker of the model.",
                 [({"model": m.model}, m.queue.depth) for m in items]),
        *_family("queue_oldest_seconds", "gauge",
                 "How long the model's oldest waiting job has waited.",
                 [({"model": m.model}, m.queue.oldest_s) for m in items]),
        *_family("requests_running", "gauge", "Jobs in the model's workers' slots.",
                 each("requests_running")),
        *_family("workers", "gauge", "Live workers of the model, by state.",
                 [({"model": m.model, "state": state}, m.workers.get(state, 0))
                  for m in items for state in WORKER_STATES]),
        *_family("cold_start_waiting", "gauge",
                 "Requests held for the model while it has no live worker.",
                 each("cold_waiting")),
        *_family("cold_start_timeouts_total", "counter",
                 "Requests refused: no worker of the model within --cold-start-timeout.",
                 each("cold_timeouts")),
    ]
    if not full:
        return lines
    for name, help_text in TOKEN_COUNTERS:
        lines += _family(name, "counter", help_text,
                         [({"model": m.model}, m.tokens.get(name, 0.0)) for m in items])
    lines += _family("jobs_retried_total", "counter",
                     "Jobs run again after their worker died before they sent anything.",
                     [({"model": m.model}, m.queue.retried) for m in items])
    lines += _family("jobs_migrated_total", "counter",
                     "Streamed completions continued on another worker after theirs died.",
                     [({"model": m.model}, m.queue.migrated) for m in items])
    lines += _family("jobs_preempted_total", "counter",
                     "Times a generation gave its slot up to a more urgent job (--preempt).",
                     [({"model": m.model}, m.queue.preempted) for m in items])
    lines += _family("jobs_failed_total", "counter", "Jobs ended by a fault, by cause.",
                     [({"model": m.model, "cause": cause}, m.queue.failed.get(cause, 0))
                      for m in items for cause in FAULT_CAUSES])
    return lines
