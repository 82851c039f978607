"""What a model's jobs in Redis look like to autoscalers: the numbers the fleet reads
(api/fleet.py) and /metrics renders (api/endpoints/monitor/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueueStats:
    """The model's jobs in Redis, for autoscalers (see scheduler/leases.py)."""

    depth: int = 0
    """Jobs that wait for a worker (in the model's queue and its workers' own queues)."""
    oldest_s: float = 0.0
    retried: int = 0
    migrated: int = 0
    """Streamed completions continued on another worker after theirs died."""
    preempted: int = 0
    """Times a generation gave its slot up to a more urgent job (--preempt)."""
    stall_buckets: dict[str, int] = field(default_factory=dict)
    """Of those, how many stalled at most `le` seconds (cumulative; by le's text)."""
    stall_count: int = 0
    stall_sum_s: float = 0.0
    failed: dict[str, int] = field(default_factory=dict)
    """Failed jobs by cause (worker_died, poison, drain_timeout)."""
    batches_in_progress: int = 0
    """Batches (the Batch API) not yet in a final state, fleet-wide."""
    batch_lines_completed: int = 0
    batch_lines_failed: int = 0
