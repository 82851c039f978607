"""/metrics: llama-server's Prometheus metrics, summed over the model's workers.

Rendered as llama-server renders them (server-task.cpp `to_metrics`): every series named
`llamacpp:<name>` exactly (a counter keeps its own name: `llamacpp:n_tokens_max` has no
`_total` added), counters first, then gauges. The speculative decoding counters are the sums
of the workers' (worker/engine/verify.py adds a run's drafts when it leaves its slot, as
llama-server's metrics_on_prediction does): they read 0 on a fleet that does not speculate, and
the per-position series is absent until a speculative request finished (the spec's rule when
it is off).

Written by hand, not with prometheus_client: its counters always end in `_total` (its
Counter("llamacpp:n_tokens_max") is written `llamacpp:n_tokens_max_total`) and come with a
`_created` gauge each, so it cannot write llama-server's series names. The tests read this text
back with prometheus_client's parser (tests/metrics_text.py), which proves it valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.queue_stats import QueueStats
from scheduler.leases import MIGRATION_STALL_BUCKETS_S
from scheduler.metrics_window import Throughput
from scheduler.registry import WorkerMetrics

PREFIX = "llamacpp:"
OURS = "llamaq:"
CONTENT_TYPE = "text/plain; version=0.0.4"
FAULT_CAUSES = ("worker_died", "poison", "drain_timeout")


@dataclass(frozen=True)
class Series:
    name: str
    help: str
    value: float


def counters(workers: list[WorkerMetrics]) -> list[Series]:
    def total(field: str) -> float:
        return float(sum(getattr(w, field) for w in workers))

    return [
        Series("prompt_tokens_total",
               "Number of prompt tokens processed, excluding cached tokens",
               total("prompt_tokens_total")),
        Series("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
               total("prompt_tokens_cached_total")),
        Series("prompt_seconds_total", "Total time spent processing prompts",
               total("prompt_seconds_total")),
        Series("tokens_predicted_total", "Number of generation tokens processed",
               total("tokens_predicted_total")),
        Series("tokens_predicted_seconds_total", "Total time spent generating tokens",
               total("tokens_predicted_seconds_total")),
        Series("n_decode_total", "Total number of llama_decode() calls, excluding speculative "
               "decoding and multimodal decoding", total("n_decode_total")),
        Series("n_tokens_max", "Largest observed sequence length (prompt + generation)",
               float(max((w.n_tokens_max for w in workers), default=0))),
        Series("spec_decode_num_draft_tokens_total",
               "Speculative: Total draft tokens generated", total("spec_draft_tokens_total")),
        Series("spec_decode_num_accepted_tokens_total",
               "Speculative: Total draft tokens accepted by the target model",
               total("spec_accepted_tokens_total")),
        Series("spec_decode_num_drafts_total",
               "Speculative: Total speculative decoding verification steps",
               total("spec_drafts_total")),
    ]


def gauges(workers: list[WorkerMetrics], queue: QueueStats, window: Throughput) -> list[Series]:
    def total(field: str) -> float:
        return float(sum(getattr(w, field) for w in workers))

    return [
        Series("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
               window.prompt_per_second),
        Series("predicted_tokens_seconds", "Average generation throughput in tokens/s",
               window.predicted_per_second),
        Series("requests_processing", "Number of requests processing",
               total("requests_processing")),
        Series("requests_deferred", "Number of requests deferred",
               total("requests_deferred") + queue.depth),
        Series("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
               total("n_busy_slots_total") / max(total("n_decode_total"), 1.0)),
    ]


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _accepted_per_pos(workers: list[WorkerMetrics]) -> list[str]:
    """llama-server's labeled counter, one series per draft position, summed over the
    workers; absent until a speculative request finished."""
    per_pos: list[int] = []
    for worker in workers:
        counts = worker.spec_accepted_per_pos
        per_pos += [0] * (len(counts) - len(per_pos))
        for i, count in enumerate(counts):
            per_pos[i] += count
    if not per_pos:
        return []
    name = f"{PREFIX}spec_decode_num_accepted_tokens_per_pos_total"
    return [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter",
            *(f'{name}{{position="{i}"}} {count}' for i, count in enumerate(per_pos))]


def _ours(queue: QueueStats) -> list[str]:
    """llamaq's own series (not llama-server's); the per-model ones autoscalers read
    (`queue_depth{model}`, …) come from model_series.py."""
    lines: list[str] = []
    for name, kind, help_text, value in (
            ("jobs_retried_total", "counter",
             "Jobs run again after their worker died before they sent anything.",
             queue.retried),
            ("jobs_migrated_total", "counter",
             "Streamed completions continued on another worker after theirs died.",
             queue.migrated),
            ("jobs_preempted_total", "counter",
             "Times a generation gave its slot up to a more urgent job (--preempt).",
             queue.preempted),
            ("batches_in_progress", "gauge",
             "Batches (Batch API) validating, in progress, finalizing or cancelling.",
             queue.batches_in_progress),
            ("batch_lines_completed_total", "counter", "Batch lines that succeeded.",
             queue.batch_lines_completed),
            ("batch_lines_failed_total", "counter", "Batch lines that failed.",
             queue.batch_lines_failed)):
        lines += [f"# HELP {OURS}{name} {help_text}", f"# TYPE {OURS}{name} {kind}",
                  f"{OURS}{name} {_number(float(value))}"]
    name = f"{OURS}migration_stall_seconds"
    lines += [f"# HELP {name} From a migrated job's last token before its worker died to its "
              "first continued token.", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{bound:g}"}} {queue.stall_buckets.get(f"{bound:g}", 0)}'
              for bound in MIGRATION_STALL_BUCKETS_S]
    lines += [f'{name}_bucket{{le="+Inf"}} {queue.stall_count}',
              f"{name}_sum {_number(queue.stall_sum_s)}", f"{name}_count {queue.stall_count}"]
    lines += [f"# HELP {OURS}jobs_failed_total Jobs ended by a fault, by cause.",
              f"# TYPE {OURS}jobs_failed_total counter"]
    lines += [f'{OURS}jobs_failed_total{{cause="{cause}"}} '
              f"{_number(float(queue.failed.get(cause, 0)))}" for cause in FAULT_CAUSES]
    return lines


TENANT_SERIES = (
    ("tenant_tokens_total", "tokens", "Prompt and generated tokens of the tenant's jobs."),
    ("tenant_requests_total", "requests", "Requests of the tenant."),
    ("tenant_rate_limited_total", "limited", "Requests of the tenant refused with 429."),
)


PRIORITY_SERIES = (
    ("tenant_wait_seconds_total", "waited_ms",
     "Seconds the tenant's completions of a priority waited to start (docs/fairness.md).", 1000),
    ("tenant_started_total", "started", "The tenant's completions of a priority that started.",
     1),
    ("tenant_preemptions_total", "preempted",
     "Times the tenant's generations of a priority gave their slot up (--preempt).", 1),
)


PRIORITY_COUNTERS = tuple(what for _, what, _, _ in PRIORITY_SERIES)
"""A tenant's counters per priority (`waited_ms@<priority>`, …)."""


def tenant_lines(tenants: dict[str, dict[str, int]]) -> list[str]:
    """Per-tenant counters (--tenants): `llamaq:tenant_tokens_total{tenant="…"}`, …"""
    lines: list[str] = []
    for name, what, help_text in TENANT_SERIES:
        lines += [f"# HELP {OURS}{name} {help_text}", f"# TYPE {OURS}{name} counter"]
        lines += [f'{OURS}{name}{{tenant="{tenant}"}} {counts.get(what, 0)}'
                  for tenant, counts in sorted(tenants.items())]
    for name, what, help_text, scale in PRIORITY_SERIES:
        lines += [f"# HELP {OURS}{name} {help_text}", f"# TYPE {OURS}{name} counter"]
        lines += [f'{OURS}{name}{{tenant="{tenant}",priority="{priority}"}} '
                  f"{_number(value / scale)}"
                  for tenant, counts in sorted(tenants.items())
                  for key, value in sorted(counts.items())
                  for kind, _, priority in [key.partition("@")] if kind == what and priority]
    return lines


def render_metrics(workers: list[WorkerMetrics], queue: QueueStats | None = None,
                   window: Throughput | None = None,
                   tenants: dict[str, dict[str, int]] | None = None,
                   per_model: list[str] | None = None) -> bytes:
    """`window`: the work since the last scrape (scheduler/metrics_window.py), which the two
    throughput gauges average, as llama-server's buckets do; `per_model`: the model's
    labelled series (model_series.py `model_lines`)."""
    queue = queue or QueueStats()
    lines: list[str] = []
    for kind, items in (("counter", counters(workers)),
                        ("gauge", gauges(workers, queue, window or Throughput()))):
        for item in items:
            lines += [f"# HELP {PREFIX}{item.name} {item.help}",
                      f"# TYPE {PREFIX}{item.name} {kind}",
                      f"{PREFIX}{item.name} {_number(item.value)}"]
    lines += _accepted_per_pos(workers)
    lines += _ours(queue)
    lines += [f"# HELP {OURS}workers_simulated Workers whose engine is the simulator "
              "(llamaq worker --simulate): their figures are not a model's.",
              f"# TYPE {OURS}workers_simulated gauge",
              f"{OURS}workers_simulated {sum(w.simulated for w in workers)}"]
    lines += per_model or []
    if tenants is not None:
        lines += tenant_lines(tenants)
    return ("\n".join(lines) + "\n").encode()
