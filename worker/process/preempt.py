"""Preemption (--preempt, ours; issue 47 item 3, docs/fairness.md): when every slot of this
worker is busy and a more urgent job waits in its queues, the least urgent running generation
gives its slot up. Its job goes back to its queue, where it keeps its place (the head of its
priority's jobs: scheduler/queue_order.py), and continues later, on this worker or another,
from the tokens it generated (the migration machinery: scheduler/migration.py); its stream sees
a pause, never an error. The slot keeps the job's tokens in its cache, so a continuation here
re-evaluates little.

Rules:
- a victim runs a completion in a slot; batch lines (`background`) go before every online
  job, else the largest priority value, then the one that started last;
- a waiting job counts when its priority value is below the victim's (any online job, for a
  batch line) and no worker holds or reserved it: one waiting job makes one worker preempt
  one generation (scheduler/queue_order.py RESERVE), not every full worker;
- aging: a job preempted MAX_PREEMPTIONS times runs to its end.

Owns: when to preempt and whom. Does not own: the hand back (worker/process/jobrun.py), the
engine's cancel, the publisher's turning of a Preempted cancel into a hand back
(worker/wires/publisher.py)."""

from __future__ import annotations

import logging
import math
from typing import Literal

from arq.constants import in_progress_key_prefix
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from scheduler.contract.errors import Preempted
from scheduler.contract.jobs import CompletionJob, JobKind
from scheduler.queue_order import RESERVE, claim_keys
from worker.jobs.parts import WorkerParts
from worker.process.jobrun import JobRunner, Running

log = logging.getLogger(__name__)

PreemptMode = Literal["off", "priority"]
MAX_PREEMPTIONS = 3
"""The aging rule: a job preempted this many times is not preempted again."""
RESERVE_MS = 10_000
"""How long a waiting job that made a worker preempt is not counted by another worker."""


def victim_order(job: CompletionJob, running: Running) -> tuple[float, float]:
    """Larger first: batch lines, then the largest priority value, then the latest start."""
    return (math.inf if job.background else float(job.priority or 0), running.started)


class Preemptor:
    def __init__(self, mode: PreemptMode, parts: WorkerParts, runner: JobRunner,
                 queues: list[str]) -> None:
        """`queues`: the online queues this worker takes completions from."""
        self.mode = mode
        self._parts = parts
        self._runner = runner
        self._keys = [key for queue in queues for key in claim_keys(queue)]
        self._reserve: AsyncScript | None = None
        self._preempting: set[str] = set()
        self._checking = False

    async def check(self) -> None:
        """Called when a queue of this worker has news and no slot is free: preempt one
        generation if a more urgent job waits."""
        if self.mode == "off" or self._checking:
            return
        victim = self._victim()
        if victim is None:
            return
        job, _ = victim
        below = "+inf" if job.background else str(job.priority or 0)
        self._checking = True
        try:
            if self._reserve is None:
                self._reserve = self._parts.redis.register_script(RESERVE)
            found = await self._reserve(keys=self._keys,
                                        args=[below, in_progress_key_prefix, RESERVE_MS])
        except RedisError as error:
            log.warning("preemption: cannot look at the queues (%s)", error)
            return
        finally:
            self._checking = False
        if not found or self._victim() != victim:  # it ended meanwhile
            return
        waiting_id, waiting_priority = (_text(v) for v in found)
        log.info("job %s (priority %s) preempted for job %s (priority %s)", job.job_id,
                 "batch" if job.background else job.priority or 0, waiting_id,
                 waiting_priority)
        self._preempting.add(job.job_id)
        self._parts.engine.cancel(job.job_id, Preempted(
            f"preempted for a more urgent job ({waiting_id})"))

    def _victim(self) -> tuple[CompletionJob, Running] | None:
        engine = self._parts.engine
        self._preempting.intersection_update(self._runner.running)
        if engine.busy_slots() < len(engine.slots):
            return None  # a slot is free: the waiting job gets it without a preemption
        found = []
        for slot, job in zip(engine.slots, engine.slot_jobs(), strict=True):
            running = None if job is None else self._runner.running.get(job.job_id)
            if slot.busy and job is not None and running is not None \
                    and running.kind is JobKind.COMPLETION \
                    and running.preempted < MAX_PREEMPTIONS \
                    and job.job_id not in self._preempting:
                found.append((job, running))
        return max(found, key=lambda v: victim_order(*v), default=None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
