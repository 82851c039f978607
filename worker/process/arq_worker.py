"""arq's Worker with three changes llamaq needs (see scheduler/leases.py):

- woken by a pub/sub message when a job is enqueued instead of polling every `poll_delay`
  (which alone would add up to that much to every time to first token): one waiting worker
  per job on its own channel (`wake_me`), not every worker of the queue (scheduler/wake.py);
- a taken job holds a short lease (arq's in-progress key), renewed by `LeaseKeeper` while the
  job runs, instead of a lock as long as `job_timeout`; a run that lost its lease (a starved
  worker) leaves the job in its queue for the run that continues it (`finish_job`);
- a poll claims the oldest due jobs no worker holds, however many running jobs precede them
  (arq reads a window of ~100 ids and skips held ones, which caps the whole fleet), in one
  round trip: the script that finds them sets their in-progress keys (arq's start_jobs spends
  four round trips per job on WATCH, EXISTS, ZSCORE and MULTI/PSETEX/EXEC), and `start_claimed`
  starts them with arq's own bookkeeping.

It relies on arq 0.28 internals (`_poll_iteration`, `start_jobs`' bookkeeping: `sem`,
`job_counter`, `tasks`, `run_job`; `in_progress_timeout_s`,
`_release_sem_dec_counter_on_complete`, `finish_job`'s signature), pinned in pyproject.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from arq import Worker
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.utils import timestamp_ms
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.leases import CLAIM_JOBS
from scheduler.queue_order import claim_keys
from scheduler.wake import LEAVE, WAITERS_TTL_MS, wake_queue

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0


class WakeableWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wake = asyncio.Event()
        self.in_progress_timeout_s = keys.JOB_LEASE_S
        self.taking = True
        """False once the worker drains: running jobs go on, no new one starts."""
        self.room: Callable[[], int] | None = None
        """How many more jobs this queue may start now (None: max_jobs bounds it alone). The
        batch queue's worker gets one: batch lines take only what online jobs leave."""
        self.admission: Callable[[int], int | None] | None = None
        """How many more jobs this worker's loop lets it start, given those it runs (None: no
        bound): a loop that lags takes no more (worker/process/loop_health.py)."""
        self.on_full: Callable[[], Awaitable[None]] | None = None
        """Called at a poll (a wake: a job was queued) that finds no room: preemption's look
        at the queue (worker/process/preempt.py)."""
        self.model_id = ""
        """The model whose fair share its claims move (scheduler/fair_share.py; "": none)."""
        self.also_wake: list[WakeableWorker] = []
        """Workers to wake when one of this worker's jobs ends (its room freed theirs)."""
        self.claims: set[str] = set()
        """Jobs claimed whose runs have not ended (scheduler/leases.py `Leases.claimed`: their
        in-progress keys are renewed from the claim on)."""
        self.lease_gone: Callable[[str], bool] = lambda _: False
        """Whether this worker lost the job's lease while running it (scheduler/leases.py
        `Leases.forget_gone`): the job went on, or goes on, as another run (another worker
        claims it from its queue once the lease lapsed)."""
        self.wake_me = ""
        """This worker's own wake channel for its queue (keys.worker_wake_channel): a poll that
        leaves it room makes it wait on the queue for the next job (scheduler/wake.py); "":
        it is woken on the queue's shared channel only (every worker of the queue)."""
        self._called = False
        """Woken on `wake_me`: a job was queued for this worker, which passes the wake on if it
        cannot take it."""
        self.idle_poll_delay_s = 0.0
        """How long a worker that waits on `wake_me` goes without looking at the queue while
        its listener is subscribed (`listening`): a queued job wakes it, so the look is only
        the safety net of a lost wake (issue 44: a look a second per lane was most of an idle
        worker's Redis commands). Not above `poll_delay_s`: every poll waits that long."""
        self.listening = False
        """The worker's listener is subscribed to its wake channels (worker/process/loops.py
        `listen`): while it is not, a wake can be missed, and the worker polls every
        `poll_delay_s`."""
        self._claim: AsyncScript | None = None
        self._drained = False
        """The last poll took fewer jobs than it had room for: the queue held no more, and any
        job enqueued since announces itself on the wake channel, so a job that ends needs no
        look at the queue of its own (one round trip less per job)."""

    async def main(self) -> None:
        assert isinstance(self._pool, ArqRedis), "WakeableWorker needs a redis_pool"
        self.ctx["redis"] = self._pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        while self.taking:
            self.wake.clear()
            try:
                await self._poll_iteration()
            except RedisError as error:  # Redis away: wait for it, do not die
                log.warning("queue %s: cannot poll Redis (%s); retrying", self.queue_name, error)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.next_poll_s())
        if self.wake_me:
            with contextlib.suppress(RedisError):
                await self._leave()

    def next_poll_s(self) -> float:
        """How long until the next look at the queue unless a wake comes first: long while
        this worker waits among the queue's waiters (its last claim left it room) and hears
        its wake channel, `poll_delay_s` otherwise (a full worker's poll costs Redis
        nothing, unless it may preempt)."""
        if self._drained and self.wake_me and self.listening:
            return max(self.poll_delay_s, self.idle_poll_delay_s)
        return self.poll_delay_s

    async def _leave(self) -> None:
        """Draining: wait for no more jobs. If a job's wake popped this worker already (its
        message may still be on its way), the wake goes on to another worker."""
        left = await self.pool.eval(  # type: ignore[misc]
            LEAVE, 1, keys.queue_waiters(self.queue_name), self.wake_me)
        if not left or self._called:
            await wake_queue(self.pool, self.queue_name)

    def call(self) -> None:
        """A message on `wake_me`: this worker came first of the waiters when a job was queued."""
        self._called = True
        self.wake.set()

    async def _poll_iteration(self) -> None:
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # a failure of arq's own job handling must not pass silently
        free = self.max_jobs - self.job_counter
        if self.room is not None:
            free = min(free, self.room())
        if free > 0 and self.admission is not None and \
                (admitted := self.admission(self.job_counter)) is not None:
            free = min(free, admitted)
        called, self._called = self._called, False
        if free <= 0 or not self.taking:
            self._drained = False  # jobs may be waiting: look when one of ours ends
            if self.on_full is not None and self.taking:
                await self.on_full()
            if called:  # the job that woke us needs another worker
                await wake_queue(self.pool, self.queue_name)
            return
        if self._claim is None:  # EVALSHA from now on (loaded again if Redis lost it)
            self._claim = self.pool.register_script(CLAIM_JOBS)
        waiting: list[str | int] = [keys.queue_waiters(self.queue_name), self.wake_me,
                                    WAITERS_TTL_MS] if self.wake_me else []
        claimed = await self._claim(keys=claim_keys(self.queue_name, self.model_id), args=[
            timestamp_ms(), free, in_progress_key_prefix, int(self.in_progress_timeout_s * 1000),
            *waiting])
        self._drained = len(claimed) // 2 < free
        if claimed:
            await self.start_claimed([(_text(claimed[i]), int(float(claimed[i + 1])))
                                      for i in range(0, len(claimed), 2)])

    async def start_claimed(self, jobs: list[tuple[str, int]]) -> None:
        """arq's start_jobs for jobs whose in-progress key the poll set already (job id, queue
        score): the same bookkeeping (sem, job_counter, tasks, the done callback), without its
        round trips. Jobs it cannot start now (the worker began draining meanwhile) are given
        back at once instead of waiting for their lease to lapse."""
        for i, (job_id, score) in enumerate(jobs):
            if not self.taking:
                await self._unclaim([j for j, _ in jobs[i:]])
                return
            await self.sem.acquire()
            if self.job_counter >= self.max_jobs:
                self.sem.release()
                await self._unclaim([j for j, _ in jobs[i:]])
                return
            self.job_counter = self.job_counter + 1
            task = self._run(job_id, score)
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())

    async def start_in_seat(self, job_id: str, score: int) -> None:
        """Start a job that a preemption's look claimed (worker/process/preempt.py) at once,
        in the seat of the generation it preempted, whose run keeps its place in `job_counter`
        until its hand back ends: this worker may run one job past `max_jobs` meanwhile (the
        engine admits the job into the slot its victim frees). The job holds no permit of
        arq's `sem`, which `job_counter` bounds (`start_claimed`)."""
        if not self.taking:
            await self._unclaim([job_id])
            return
        self.job_counter = self.job_counter + 1
        task = self._run(job_id, score)
        task.add_done_callback(lambda _: self._ended(release=False))

    def _run(self, job_id: str, score: int) -> asyncio.Task[None]:
        """arq's run of a claimed job, its claim kept (renewed) until the run ends."""
        self.claims.add(job_id)
        task = self.loop.create_task(self.run_job(job_id, score))
        task.add_done_callback(lambda _: self.claims.discard(job_id))
        self.tasks[job_id] = task
        return task

    async def _unclaim(self, job_ids: list[str]) -> None:
        """Give back jobs claimed and not started: a waiting worker takes them now."""
        await self.pool.delete(*(in_progress_key_prefix + job_id for job_id in job_ids))
        await wake_queue(self.pool, self.queue_name)

    async def finish_job(self, job_id: str, finish: bool, result_data: bytes | None,
                         result_timeout_s: float | None, keep_result_forever: bool,
                         incr_score: int | None, keep_in_progress: float | None) -> None:
        """arq's end of a run, except for a run whose lease was lost (its worker starved past
        it): arq would take the job out of its queue and delete its data and in-progress key,
        and the run that goes on (or is about to) would never start, or run twice, while its
        client waits for events that never come."""
        if self.lease_gone(job_id):
            log.warning("job %s: this worker lost its lease; the job stays in its queue for "
                        "the run that continues it", job_id)
            return
        if finish and not result_data and keep_in_progress is None:
            # a job that ended and keeps no result in arq (keep_result=0): out of its queue,
            # its arq keys gone, in one round trip of 2 commands; arq's own finish is a
            # MULTI/EXEC of 5 that also takes it out of its abort set, which llamaq never
            # fills (cancels go on its own channel) (issue 44). Not atomic: once out of the
            # queue nobody claims the job, so its keys going a moment later is harmless.
            async with self.pool.pipeline(transaction=False) as pipe:
                pipe.zrem(self.queue_name, job_id)
                pipe.delete(in_progress_key_prefix + job_id, retry_key_prefix + job_id,
                            job_key_prefix + job_id)
                await pipe.execute()
            return
        await super().finish_job(job_id, finish, result_data, result_timeout_s,
                                 keep_result_forever, incr_score, keep_in_progress)
        if not finish and keep_in_progress is None and not incr_score:
            # handed back (a drain, a preemption): claimable now, and no enqueue tells the
            # waiting workers, whose safety poll is `idle_poll_delay_s` away
            await wake_queue(self.pool, self.queue_name)

    def running_job_ids(self) -> list[str]:
        return [job_id for job_id, task in self.tasks.items() if not task.done()]

    def _release_sem_dec_counter_on_complete(self) -> None:
        self._ended(release=True)

    def _ended(self, release: bool) -> None:
        """A job ended (`release`: it held a permit of `sem`), so there is room for another:
        look at the queue now, unless the last look found it drained (then a new job wakes
        us)."""
        self.job_counter = self.job_counter - 1
        if release:
            self.sem.release()
        if not self._drained:
            self.wake.set()
        for other in self.also_wake:
            if not other._drained or not other.wake_me:  # a drained waiter: a job wakes it
                other.wake.set()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
