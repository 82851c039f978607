"""The keys and channels of issue 44's cuts beside scheduler/contract/keys.py's: a pod's own
channel, the mark of a job that another pod reads, and the index of a model's queued jobs."""

from __future__ import annotations

from scheduler.contract.keys import PREFIX


def pod_events(pod_id: str) -> str:
    """Pub/sub channel of one api pod's event hub (scheduler/hub.py): workers announce there
    the events of the completion jobs it queued, a flush's in one message."""
    return f"{PREFIX}:hub:{pod_id}"


def job_watched(job_id: str) -> str:
    """Set while an api pod other than the one that queued the job reads its events (a
    resumed stream, scheduler/client.py attach): its events are announced on its own channel
    too, not only on the queuing pod's (worker/wires/fenced_write.py)."""
    return f"{PREFIX}:job:{job_id}:watched"


def model_queued(model_id: str) -> str:
    """Sorted set of the jobs queued for the model's slots, on its shared queue or a worker's
    own (member `<queue>\\n<job>`, score its enqueue time): the enqueue's bound counts the
    waiting ones from it in a few commands however many workers are live (issue 44: a
    ZRANGEBYSCORE of each live worker's queue a job before; scheduler/queue_index.py)."""
    return f"{PREFIX}:model:{model_id}:queued"
