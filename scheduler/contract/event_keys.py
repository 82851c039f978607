"""The keys and channels of a job's announcements beside scheduler/contract/keys.py's (issue
44): a pod's own channel, and the mark of a job that another pod reads."""

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
