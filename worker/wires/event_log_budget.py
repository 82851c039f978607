"""A job's event log in Redis is capped in bytes as well as in events (issue 43, item 9): with
n_probs 100 an event is ~7 KB, and 20,000 of them (the count cap alone) were 140 MB of Redis
per job for EVENT_LOG_TTL_S. The publisher counts what it logs per job and, past
keys.EVENT_LOG_MAX_BYTES or keys.EVENT_LOG_MAXLEN, has the log trimmed below the oldest event it
keeps (XADD MINID, exact): a resume from before that is a 404 and the job cannot migrate, as
past the count cap before. The newest event is always kept. A completion job carries its share
of its request's budget (CompletionJob.event_log_max_bytes, set by the api: a request of 512
jobs does not get 512 times the cap).

Owns: which of a job's events its log keeps. Does not own: writing them
(worker/wires/publisher.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from scheduler.contract import keys


@dataclass
class _Kept:
    first_seq: int
    """The seq of the oldest event the log keeps of those counted (sizes[0])."""
    sizes: deque[int] = field(default_factory=deque)
    total: int = 0
    trimming: bool = False
    """Whether the log has been cut: every later event carries where."""


class EventLogBudget:
    """Per running job, the sizes of the events this worker logged that the log keeps."""

    def __init__(self, max_bytes: int = keys.EVENT_LOG_MAX_BYTES,
                 max_events: int = keys.EVENT_LOG_MAXLEN) -> None:
        self.max_bytes = max_bytes
        self.max_events = max_events
        self._jobs: dict[str, _Kept] = {}
        self._limits: dict[str, int] = {}
        """A job's own bytes (its share of its request's budget), below max_bytes."""

    def limit(self, job_id: str, max_bytes: int) -> None:
        """The job's log keeps at most `max_bytes` (at most max_bytes of this budget)."""
        if max_bytes > 0:
            self._limits[job_id] = min(max_bytes, self.max_bytes)

    def add(self, job_id: str, seq: int, size: int) -> int | None:
        """Count the job's event `seq` of `size` bytes; the seq of the oldest event its log
        keeps once that one is in, or None while nothing needs trimming. Events of a job come
        in seq order; a gap (a run elsewhere in between) starts the count again."""
        kept = self._jobs.get(job_id)
        if kept is None or kept.first_seq + len(kept.sizes) != seq:
            kept = self._jobs[job_id] = _Kept(first_seq=seq)
        kept.sizes.append(size)
        kept.total += size
        max_bytes = self._limits.get(job_id, self.max_bytes)
        while len(kept.sizes) > 1 and (kept.total > max_bytes
                                       or len(kept.sizes) > self.max_events):
            kept.total -= kept.sizes.popleft()
            kept.first_seq += 1
            kept.trimming = True
        return kept.first_seq if kept.trimming else None

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)
        self._limits.pop(job_id, None)
