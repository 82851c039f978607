"""The Redis keys of preemption's calls (issue 47: one look per queued job,
scheduler/preempt_call.py); the rest of llamaq's keys are in scheduler/contract/keys.py."""

from __future__ import annotations


def queue_preemptors(queue_name: str) -> str:
    """Sorted set of the preemption channels of the workers of `queue_name` whose every slot is
    busy, scored by their least urgent running generation's priority (+inf: a batch line): the
    enqueue of a more urgent job calls the one with the largest (scheduler/preempt_call.py)."""
    return f"{queue_name}:preemptors"


def worker_preempt_channel(queue_name: str, worker_id: str) -> str:
    """One worker's preemption channel for `queue_name`: published when a job is queued that
    this worker, of all the full ones, may preempt a generation for (scheduler/preempt_call.py)."""
    return f"{queue_name}:preempt:{worker_id}"
