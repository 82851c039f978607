"""Preemption (--preempt, ours; issue 47 item 3, docs/fairness.md): when every slot of this
worker is busy and a more urgent job waits in its queues, the least urgent running generation
gives its slot up, and the waiting job takes its seat at once: the look claims it (as a poll
would) and this worker starts it while the victim winds down (its hand back, arq's retry), so
that neither that nor a poll is on the waiting job's way to the slot. The victim's job goes
back to its queue, where it keeps its place (the head of its priority's jobs:
scheduler/queue_order.py), and continues later, on this worker or another,
from the tokens it generated (the migration machinery: scheduler/migration.py); its stream sees
a pause, never an error. The slot keeps the job's tokens in its cache, so a continuation here
re-evaluates little.

Rules:
- a victim runs a completion in a slot; batch lines (`background`) go before every online
  job, else the largest priority value, then the one that started last;
- a waiting job counts when its priority value is below the victim's (any online job, for a
  batch line) and no worker holds it: the look claims it, so one waiting job makes one worker
  preempt one generation (scheduler/queue_order.py CLAIM_URGENT), not every full worker;
- aging: a job preempted MAX_PREEMPTIONS times runs to its end;
- `fair` (besides the above): a waiting job of a priority value at most a running one's whose
  tenant holds fewer of this worker's slots than its weighted share takes a slot from the
  tenant most over its share (fair_victim).

Owns: when to preempt and whom. Does not own: the hand back (worker/process/jobrun.py), the
engine's cancel, the publisher's turning of a Preempted cancel into a hand back
(worker/wires/publisher.py)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

from arq.constants import in_progress_key_prefix, job_key_prefix
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.contract.errors import Preempted
from scheduler.contract.jobs import CompletionJob, JobKind
from scheduler.fair_share import DEFAULT_TENANT
from scheduler.queue_order import (
    CANDIDATES,
    CLAIM_ONE,
    CLAIM_URGENT,
    claim_keys,
    queue_order_of,
    urgent_keys,
)
from scheduler.queueing import deserialize_job
from worker.jobs.parts import WorkerParts
from worker.process.arq_worker import WakeableWorker
from worker.process.jobrun import JobRunner, Running

log = logging.getLogger(__name__)

PreemptMode = Literal["off", "priority", "fair"]
MAX_PREEMPTIONS = 3
"""The aging rule: a job preempted this many times is not preempted again."""
FAIR_CANDIDATES = 16
"""How many waiting jobs per queue `fair` looks at for one whose tenant is below its share."""


def victim_order(job: CompletionJob, running: Running) -> tuple[float, float]:
    """Larger first: batch lines, then the largest priority value, then the latest start."""
    return (math.inf if job.background else float(job.priority or 0), running.started)


@dataclass(frozen=True)
class Waiting:
    """A waiting job as the fair rule reads it."""

    tenant: str
    weight: float
    priority: int


EPSILON = 1e-9
"""Shares are fractions of slots: a tolerance for their sums."""


def _tenant(job: CompletionJob) -> str:
    return job.tenant or DEFAULT_TENANT


def fair_victim(runs: list[tuple[CompletionJob, Running]], n_slots: int, waiting: Waiting
                ) -> CompletionJob | None:
    """`--preempt fair`: the generation that gives its slot up to `waiting`, or None.
    The tenants of `runs` (this worker's running online generations) and the waiting job's
    share the slots by weight; the waiting job's tenant must stay within its share with one
    slot more, and the victim's tenant within its share with one slot less (so two tenants
    never take a slot from each other back and forth). The victim: the tenant most over its
    share, its run of the largest priority value (never one more urgent than the waiting job),
    then the latest started."""
    held: dict[str, int] = {}
    weights = {waiting.tenant: waiting.weight}
    for job, _ in runs:
        held[_tenant(job)] = held.get(_tenant(job), 0) + 1
        weights[_tenant(job)] = job.weight
    total = sum(weights.values())
    share = {tenant: n_slots * weight / total for tenant, weight in weights.items()}
    if held.get(waiting.tenant, 0) + 1 > share[waiting.tenant] + EPSILON:
        return None
    over = [(job, running) for job, running in runs
            if (job.priority or 0) >= waiting.priority
            and held[_tenant(job)] - 1 >= share[_tenant(job)] - EPSILON]

    def order(run: tuple[CompletionJob, Running]) -> tuple[float, float, float]:
        return (held[_tenant(run[0])] / share[_tenant(run[0])], float(run[0].priority or 0),
                run[1].started)
    if not over:
        return None
    return max(over, key=order)[0]


class Preemptor:
    def __init__(self, mode: PreemptMode, parts: WorkerParts, runner: JobRunner,
                 workers: list[WakeableWorker]) -> None:
        """`workers`: the arq workers of the online queues this worker takes completions
        from (a claimed job starts on its queue's)."""
        self.mode = mode
        self._parts = parts
        self._runner = runner
        self._workers = workers
        self._queues = [worker.queue_name for worker in workers]
        self._keys = [key for queue in self._queues for key in claim_keys(queue)]
        self._urgent_keys = urgent_keys(parts.model_id, self._queues)
        self._claim: AsyncScript | None = None
        self._preempting: set[str] = set()
        self._checking = False
        self._again = False

    async def check(self) -> None:
        """Called when a queue of this worker has news and no slot is free: preempt one
        generation if a more urgent job waits (`fair`: or a job of a tenant below its share).
        News that comes while a look runs makes it look again once it ends (never lost)."""
        if self.mode == "off" or not all(worker.taking for worker in self._workers):
            return
        if self._checking:
            self._again = True
            return
        self._checking = True
        try:
            self._again = True
            while self._again:
                self._again = False
                if not await self._check_priority() and self.mode == "fair":
                    await self._check_fair()
        except RedisError as error:
            log.warning("preemption: cannot look at the queues (%s)", error)
        finally:
            self._checking = False

    async def _check_priority(self) -> bool:
        victim = self._victim()
        if victim is None:
            return False
        job, _ = victim
        below = "+inf" if job.background else str(job.priority or 0)
        if self._claim is None:
            self._claim = self._parts.redis.register_script(CLAIM_URGENT)
        found = await self._claim(keys=self._urgent_keys,
                                  args=[below, in_progress_key_prefix, _lease_ms()])
        if not found:
            return False
        waiting_id, priority, score, queue = (_text(v) for v in found)
        self._runner.start_early(waiting_id)
        now = self._victim()  # the look took a round trip: the victim may have ended
        if now is not None and victim_order(*now) > (int(priority), math.inf):
            self._preempt(now[0], waiting_id, priority)
        # claimed: it runs here now, in the victim's seat (or, if a slot freed meanwhile, in
        # that one; else it waits in the engine, first by priority, for the next slot)
        await self._workers[int(queue) - 1].start_in_seat(waiting_id, int(float(score)))
        return True

    async def _check_fair(self) -> None:
        """The first waiting job (by priority, then order) whose tenant is below its share
        of this worker's slots takes a slot from the tenant most over its share."""
        runs = self._runs()
        if not runs:
            return
        bound = max(job.priority or 0 for job, _ in runs)
        redis = self._parts.redis
        found = await redis.eval(CANDIDATES, len(self._keys), *self._keys,  # type: ignore[misc]
                                 str(bound), in_progress_key_prefix, str(FAIR_CANDIDATES))
        candidates = [(int(_text(found[i])), _text(found[i + 1]), int(_text(found[i + 2])),
                       _text(found[i + 3]), _text(found[i + 4]))
                      for i in range(0, len(found), 5)]
        candidates.sort(key=lambda c: c[2])
        if not candidates:
            return
        datas = await redis.mget([job_key_prefix + c[1] for c in candidates])
        for (queue, waiting_id, priority, order, score), data in zip(candidates, datas,
                                                                      strict=True):
            waiting = _waiting(data, priority)
            victim = None if waiting is None else fair_victim(self._runs(), self._n_slots(),
                                                              waiting)
            if victim is None or waiting is None:
                continue
            victim_orders = [queue_order_of(name, victim.priority or 0)
                             for name in self._queues]
            if not await redis.eval(  # type: ignore[misc]
                    CLAIM_ONE, 2 + len(victim_orders), self._urgent_keys[0],
                    self._queues[queue - 1], *victim_orders, waiting_id,
                    in_progress_key_prefix, str(_lease_ms()), order, victim.job_id):
                return
            self._runner.start_early(waiting_id)
            if victim.job_id in self._runner.running:
                self._preempt(victim, waiting_id, f"{priority}, tenant {waiting.tenant}")
            await self._workers[queue - 1].start_in_seat(waiting_id, int(float(score)))
            return

    def _preempt(self, job: CompletionJob, waiting_id: str, waiting_priority: str) -> None:
        log.info("job %s (priority %s) preempted for job %s (priority %s)", job.job_id,
                 "batch" if job.background else job.priority or 0, waiting_id,
                 waiting_priority)
        self._preempting.add(job.job_id)
        self._parts.engine.cancel(job.job_id, Preempted(
            f"preempted for a more urgent job ({waiting_id})"))

    def _n_slots(self) -> int:
        return len(self._parts.engine.slots)

    def victim_priority(self) -> float | None:
        """The priority value of the generation the priority rule would preempt now (inf: a
        batch line), or None (a free slot, or nothing it may preempt)."""
        victim = self._victim()
        return None if victim is None else victim_order(*victim)[0]

    def _victim(self) -> tuple[CompletionJob, Running] | None:
        """The priority rule's victim: the least urgent of _runs (victim_order)."""
        return max(self._runs(), key=lambda v: victim_order(*v), default=None)

    def _runs(self) -> list[tuple[CompletionJob, Running]]:
        """The generations that may be preempted, when every slot is busy (else none: a
        waiting job gets the free slot without a preemption)."""
        engine = self._parts.engine
        self._preempting.intersection_update(self._runner.running)
        if engine.busy_slots() < len(engine.slots):
            return []
        found = []
        for slot, job in zip(engine.slots, engine.slot_jobs(), strict=True):
            running = None if job is None else self._runner.running.get(job.job_id)
            if slot.busy and job is not None and running is not None \
                    and running.kind is JobKind.COMPLETION \
                    and running.preempted < MAX_PREEMPTIONS \
                    and job.job_id not in self._preempting:
                found.append((job, running))
        return found


def _waiting(data: bytes | None, priority: int) -> Waiting | None:
    """A waiting job's tenant and weight from its arq job data (None: it is gone, or not a
    completion)."""
    if data is None:
        return None
    decoded = deserialize_job(data)
    args = decoded.get("a") or [None]
    job = args[0]
    if decoded.get("f") != JobKind.COMPLETION or not isinstance(job, dict):
        return None
    return Waiting(job.get("tenant") or DEFAULT_TENANT, float(job.get("weight") or 1.0),
                   priority)


def _lease_ms() -> int:
    """A claimed job's lease, as a poll's claim sets it (WakeableWorker)."""
    return int(keys.JOB_LEASE_S * 1000)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
