"""When this worker looks for a job to preempt a generation for (issue 47: one look per queued
job, scheduler/preempt_call.py): while every slot is busy it is among its slot queue's
preemptors, scored by the priority of the generation it would give up; a job queued that no
waiting worker takes calls the one full worker of the largest score above its priority, on its
preemption channel, and only that worker looks. Before, every full worker looked at each
queued job (the queue's shared wake): one CLAIM_URGENT per full worker, of which the first
claimed the job.

- its slots change (a run starts or ends): it joins the preemptors with its score, or leaves
  them (not full, nothing it may preempt, draining); a join that finds a more urgent job
  waiting already (queued before the join) looks at once;
- a call: it looks (worker/process/preempt.py Preemptor.check), then joins again (the call
  took it out, so that the next urgent job calls another worker);
- the shared wake of the slot queue (a job that called nobody): `--preempt fair` looks (a
  tenant below its share); `priority` only as the safety net, when its last look is older
  than --poll-delay (a call lost with its connection, a score Redis had not yet heard of);
- the worker's own queue's news: it looks (only this worker hears them).

Owns: when to look and the worker's place among the preemptors. Does not own: the look and
whom to preempt (worker/process/preempt.py), the Lua (scheduler/preempt_call.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from arq.constants import in_progress_key_prefix
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from scheduler.contract import preempt_keys
from scheduler.preempt_call import ADVERTISE
from scheduler.queue_order import claim_keys
from scheduler.wake import WAITERS_TTL_MS
from worker.jobs.parts import WorkerParts
from worker.process.arq_worker import WakeableWorker
from worker.process.jobrun import JobRunner
from worker.process.preempt import PreemptMode, Preemptor

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0


class PreemptCalls:
    def __init__(self, preemptor: Preemptor, parts: WorkerParts, slot: WakeableWorker,
                 online: list[WakeableWorker], poll_delay_s: float) -> None:
        """`slot`: the arq worker of the model's slot queue; `online`: those of the online
        queues this worker takes completions from (the slot queue's and its own)."""
        self._preemptor = preemptor
        self._parts = parts
        self._online = online
        self._poll_delay_s = poll_delay_s
        self.channel = preempt_keys.worker_preempt_channel(slot.queue_name, parts.worker_id)
        self._keys = [preempt_keys.queue_preemptors(slot.queue_name),
                      *(key for worker in online for key in claim_keys(worker.queue_name))]
        self._advertise: AsyncScript | None = None
        self._changed = asyncio.Event()
        self._changed.set()  # join at start if full (a restart under load)
        self._joined: str | None = None
        """The score Redis holds for this worker ("": none; None: unknown, write it)."""
        self._calls = 0
        """Calls heard so far: one that comes while a join is on its way took the join out."""
        self._looked = -math.inf
        """When this worker last looked (or joined, which looks too): the safety net's clock."""
        self._tasks: set[asyncio.Task[None]] = set()

    def changed(self) -> None:
        """Its slots changed (on the event loop): join or leave the preemptors."""
        self._changed.set()

    def call(self) -> None:
        """A message on its preemption channel: a queued job may preempt here."""
        task = asyncio.get_running_loop().create_task(self._called())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def on_shared_wake(self) -> None:
        """A poll of the slot queue that found no room (its shared wake, or a poll's timer)."""
        if self._preemptor.mode == "fair" \
                or time.monotonic() - self._looked >= self._poll_delay_s:
            await self.look()

    async def look(self) -> None:
        self._looked = time.monotonic()
        await self._preemptor.check()

    async def _called(self) -> None:
        self._calls += 1
        self._joined = None  # the call popped it: join again whatever the look finds
        await self.look()
        self._changed.set()

    def _score(self) -> str:
        """What Redis should hold for this worker: the priority of the generation it would
        preempt ("+inf": a batch line), or "" (a free slot, nothing it may preempt, draining)."""
        if not all(worker.taking for worker in self._online):
            return ""
        victim = self._preemptor.victim_priority()
        if victim is None:
            return ""
        return "+inf" if math.isinf(victim) else repr(victim)

    async def run(self) -> None:
        """Keep this worker's place among the preemptors as its slots change."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            score = self._score()
            if score == self._joined:
                continue
            try:
                if await self._write(score):
                    await self.look()
            except RedisError as error:
                log.warning("preemption: cannot tell Redis this worker is full (%s)", error)
                self._joined = None
                await asyncio.sleep(REDIS_RETRY_S)
                self._changed.set()

    async def _write(self, score: str) -> bool:
        if self._advertise is None:
            self._advertise = self._parts.redis.register_script(ADVERTISE)
        self._looked = time.monotonic() if score else self._looked
        calls = self._calls
        urgent = await self._advertise(keys=self._keys, args=[
            self.channel, score, in_progress_key_prefix, WAITERS_TTL_MS])
        self._joined = score if calls == self._calls else None
        return bool(urgent)

    async def leave(self) -> None:
        """Draining: no more calls (a call would find nothing it may do)."""
        try:
            await self._write("")
        except RedisError as error:
            log.warning("preemption: cannot leave the preemptors (%s)", error)


def preemption(mode: PreemptMode, parts: WorkerParts, runner: JobRunner,
               online: list[WakeableWorker], slot_queue: str, poll_delay_s: float
               ) -> PreemptCalls | None:
    """--preempt: the looks of this worker (None: off, or no online completion queue)."""
    if mode == "off" or parts.embedder is not None or not online:
        return None
    preemptor = Preemptor(mode, parts, runner, online)
    slot = next((w for w in online if w.queue_name == slot_queue), None)
    if slot is None:
        for worker in online:
            worker.on_full = preemptor.check
        return None
    calls = PreemptCalls(preemptor, parts, slot, online, poll_delay_s)
    for worker in online:
        worker.on_full = calls.on_shared_wake if worker is slot else calls.look
    return calls


def channels(calls: PreemptCalls | None) -> dict[str, Callable[[], None]]:
    """The listener's channels for `calls` (none without preemption)."""
    return {} if calls is None else {calls.channel: calls.call}

