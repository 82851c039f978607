"""A worker's background loops, each for the worker's life: reports (metrics, slots, prefixes,
heartbeats) and the listener (wake-ups, cancellations, reasoning ends); what a lost lease stops
(the renewal is a thread's: worker/process/lease_keeper.py).

Redis going away never ends a loop: each retries until Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from scheduler.affinity import PrefixIndex
from scheduler.contract import keys
from scheduler.contract.errors import Unavailable
from scheduler.pubsub_watch import WatchedPubSub
from scheduler.registry import Registry, SlotState, WorkerInfo, write_heartbeat, write_slots
from worker.jobs.parts import WorkerParts
from worker.process.arq_worker import WakeableWorker

log = logging.getLogger(__name__)

SLOT_REPORT_MIN_GAP_S = 0.1
"""Slot changes are reported at most this often (the last one always is)."""
REPORT_REFRESH_S = keys.HEARTBEAT_TTL_S / 2
"""Metrics, slots and prefix summary that did not change since they were last written go again
with the first heartbeat this long after (before they expire, HEARTBEAT_TTL_S), not with every
heartbeat (issue 44: their three SETs every 2 s were most of an idle worker's commands)."""
REDIS_RETRY_S = 1.0
LISTENER_PING_S = 2.0
LISTENER_SILENT_S = 6.0
"""The listener pings Redis this often and drops a connection silent this long (a frozen or
partitioned Redis; the api's readers: 1 s and 3 s): its ping was most of an idle worker's
round trips to Redis, which are what Redis's idle CPU follows (issue 44: ~60 % of 1.6 a
second); a lost connection is noticed within 6 s and its workers then poll every
--poll-delay until it hears again."""


@dataclass
class RegistryEntry:
    """This worker's registry entry, as its heartbeats write it (idle sleep rewrites it)."""

    info: WorkerInfo


def on_lost_leases(parts: WorkerParts) -> Callable[[list[str]], None]:
    """What a lost lease stops (worker/process/lease_keeper.py tells it on the loop): a job
    whose lease lapsed anyway (the process was frozen, or its loop stuck) may run elsewhere
    now: this worker stops it and sends nothing more for it."""
    def lost(job_ids: list[str]) -> None:
        for job_id in job_ids:
            log.error("job %s: lease lost (worker %s was too slow to renew it); "
                      "stopping it here", job_id, parts.worker_id)
            parts.publisher.abandon(job_id, Unavailable("lease lost"))
            parts.engine.cancel(job_id)
    return lost


class Reporter:
    """What the worker tells the fleet: metrics, slot states and prefix summaries (ahead of
    the events that end jobs, and in every report) and its heartbeat."""

    def __init__(self, parts: WorkerParts) -> None:
        self._parts = parts
        self._prefixes = PrefixIndex()
        self._changes = 0
        """Slot changes the engine told of so far (counted on the loop)."""
        self.on_change: list[Callable[[], None]] = []
        """Called on the event loop when a slot starts or ends a request."""
        self._reported = -1
        """`_changes` when the last complete report (slots included) was queued: a flush
        that starts or ends a job writes one ahead of its events, after the change that the
        slot-change loop would report again (issue 44: three SETs a job start and end)."""
        self._slot_bodies: dict[int, tuple[SlotState, str]] = {}
        """Each slot's last written state and its JSON (scheduler/registry.write_slots)."""
        self._written: tuple[float, str] = (-REPORT_REFRESH_S, "")
        """When the last complete report was queued, and the metrics it wrote."""

    def write_metrics(self, pipe: Pipeline, report: bool = False) -> None:
        """Metrics and slot states, written ahead of the events that end jobs: a client that
        got its result sees its slot idle in /slots, as llama-server shows it. An embedding
        worker's slots (its completion engine's, always idle) go in its reports only."""
        parts = self._parts
        engine, embedder = parts.engine, parts.embedder
        metrics = (embedder or engine).metrics_snapshot()
        body = metrics.model_dump_json()
        pipe.set(keys.worker_metrics(parts.worker_id), body, ex=keys.HEARTBEAT_TTL_S)
        if embedder is None or report:
            write_slots(pipe, parts.worker_id, engine.slot_states(), self._slot_bodies)
            self._reported = self._changes
            self._written = (time.monotonic(), body)
        if embedder is None:  # cache-aware routing: only completion workers take part
            n_free = (len(engine.slots) - metrics.requests_processing
                      - metrics.requests_deferred)
            held = engine.slot_jobs()
            running = [job for slot, job in zip(engine.slots, held, strict=True)
                       if slot.busy and job is not None]
            pipe.set(keys.worker_prefixes(parts.worker_id),
                     self._prefixes.summary(held, n_free, running).model_dump_json(),
                     ex=keys.HEARTBEAT_TTL_S)

    def _unchanged(self) -> bool:
        """Whether the last complete report still says it all: no slot changed since, the
        metrics read the same, and it is younger than REPORT_REFRESH_S."""
        at, body = self._written
        if time.monotonic() - at >= REPORT_REFRESH_S:
            return False
        parts = self._parts
        return (parts.embedder or parts.engine).metrics_snapshot().model_dump_json() == body

    async def run(self, registry: Registry, entry: RegistryEntry) -> None:
        """Heartbeats, and the slots' state whenever a slot starts or ends a request."""
        parts = self._parts
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()

        def changed_now() -> None:
            self._changes += 1
            changed.set()
            for callback in self.on_change:
                callback()

        def notify() -> None:
            loop.call_soon_threadsafe(changed_now)

        parts.engine.on_slots_changed = notify
        next_heartbeat = 0.0
        while True:
            changed.clear()
            beat = time.monotonic() >= next_heartbeat
            try:  # one round trip: slots, metrics, and the heartbeat when due; not the
                # slots again when a flush wrote them after the last change (a flush given
                # up for want of Redis leaves them to the next heartbeat)
                report = self._reported != self._changes or (beat and not self._unchanged())
                if beat or report:
                    async with parts.redis.pipeline(transaction=False) as pipe:
                        if report:
                            self.write_metrics(pipe, report=True)
                        if beat:
                            write_heartbeat(pipe, entry.info)
                        await pipe.execute()
                if beat:
                    next_heartbeat = time.monotonic() + keys.HEARTBEAT_EVERY_S
            except RedisError as error:  # Redis away: keep trying, the worker lives on
                log.warning("cannot report to Redis (%s); retrying", error)
                next_heartbeat = 0.0
                self._written = (-REPORT_REFRESH_S, "")  # not written: all of it next time
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), next_heartbeat - time.monotonic())
            await asyncio.sleep(SLOT_REPORT_MIN_GAP_S)  # many changes at once: one report


async def listen(parts: WorkerParts, *workers: WakeableWorker,
                 on_lora: Callable[[], None] = lambda: None,
                 more: dict[str, Callable[[], None]] | None = None) -> None:
    """Wake-ups for our queues, cancellations, reasoning ends and new global LoRA scales of
    our model (`on_lora`), and the channels of `more` (preemption calls), on one pub/sub
    connection."""
    by_channel = {**wake_channels(workers), **(more or {})}
    pubsub = parts.redis.pubsub(ignore_subscribe_messages=True)
    # polls: the client's reply timeout is not for idle reads
    watched = WatchedPubSub(pubsub, LISTENER_PING_S, LISTENER_SILENT_S)
    retry_s = 0.0
    while True:
        try:
            await pubsub.subscribe(keys.CANCEL_CHANNEL, keys.CONTROL_CHANNEL, keys.LORA_CHANNEL,
                                   *by_channel)
            watched.restart()
            for worker in workers:  # a wake published while we did not listen was lost
                worker.listening = True
                worker.wake.set()
            retry_s = 0.0
            while True:
                if (message := await watched.get_message()) is not None:
                    on_message(parts, message, by_channel, on_lora)
        except (RedisError, TimeoutError) as error:  # resubscribes when Redis answers again
            log.warning("listener lost Redis (%s); reconnecting", error)
            for worker in workers:
                worker.listening = False  # polls every --poll-delay until it listens again
                worker.wake.set()  # jobs enqueued meanwhile announced nothing
            # at once the first time: this connection shows api pods the worker is alive
            # (scheduler/worker_presence.py), so it is not gone for longer than a blip
            await asyncio.sleep(retry_s)
            retry_s = REDIS_RETRY_S


def wake_channels(workers: Iterable[WakeableWorker]) -> dict[str, Callable[[], None]]:
    """The wake channels a worker process listens to, and what each message on them does:
    a queue's shared channel makes its worker look (its full workers, preemption), a
    worker's own channel calls it (a job for it: scheduler/wake.py)."""
    by_channel: dict[str, Callable[[], None]] = {}
    for worker in workers:
        by_channel[keys.wake_channel(worker.queue_name)] = worker.wake.set
        if worker.wake_me:
            by_channel[worker.wake_me] = worker.call
    return by_channel


def on_message(parts: WorkerParts, message: dict[str, Any],
               by_channel: dict[str, Callable[[], None]],
               on_lora: Callable[[], None] = lambda: None) -> None:
    if message["type"] != "message":
        return
    channel = message["channel"].decode()
    try:
        data = message["data"].decode()
    except UnicodeDecodeError:  # junk anyone may publish: it must not stop the listener
        log.warning("malformed message on %s: %r", channel, message["data"][:100])
        return
    if channel == keys.CANCEL_CHANNEL:
        parts.engine.cancel(data)
        if parts.embedder is not None:
            parts.embedder.cancel(data)
    elif channel == keys.CONTROL_CHANNEL:
        parts.engine.end_reasoning(data)
    elif channel == keys.LORA_CHANNEL:
        if data == parts.model_id:
            on_lora()
    elif channel in by_channel:
        by_channel[channel]()
