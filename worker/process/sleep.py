"""Idle sleep (--sleep-idle-seconds, the spec's "Sleeping on idle"): a worker that ran no job
for that long unloads its model and frees the memory (weights, KV cache, compute buffers); the
next job it takes wakes it (loads the model again) before it runs.

Only jobs count as activity: the api's GET /health, /props, /models, /metrics and /slots read
the registry and never reach a worker, so they neither wake it nor reset its idle time. While
asleep the worker stays in the registry (heartbeats, its queues polled) with `sleeping` true in
its WorkerInfo: `/props` shows `is_sleeping`, and `scheduler.registry.fleet_sleeping` tells the
`/models` listing to show `sleeping`. Its prefix summary is empty (its slots hold nothing), so
cache-aware routing sends it nothing; jobs from the shared queue wake it.

`IdleClock` is the plain state (jobs running, time of the last one); `Sleeper` drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.fleet_models import status_event
from scheduler.registry import Registry, WorkerMetrics
from worker.embed.embedder import Embedder
from worker.jobs.parts import WorkerParts
from worker.process.loops import RegistryEntry
from worker.process.startup import load_model, new_engine
from worker.runtime.compute_threads import wait_policy_by_hand

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""How often an awake worker looks at its idle time (at most this late to sleep)."""


@dataclass
class IdleClock:
    """When a worker may sleep: no job running, and the last one ended `idle_s` ago."""

    idle_s: float
    now: Callable[[], float] = time.monotonic
    active: int = 0
    last: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last = self.now()

    def begin(self) -> None:
        self.active += 1
        self.last = self.now()

    def end(self) -> None:
        self.active -= 1
        self.last = self.now()

    def due(self) -> bool:
        return self.idle_s >= 0 and self.active == 0 and self.now() - self.last >= self.idle_s

    def left(self) -> float:
        """Seconds until `due` (with no job coming)."""
        return max(0.0, self.idle_s - (self.now() - self.last))


def release_freed_memory() -> None:
    """Give the heap pages freed with the model back to the system (glibc keeps them
    otherwise, and the process's RSS would not show the unload)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reload_engine(parts: WorkerParts) -> None:
    """Load the model again and start a new engine on it (a worker waking from idle sleep;
    blocking: call it off the event loop); the worker's counters carry on."""
    old = parts.engine
    model = load_model(parts.settings, parts.model.path,
                       adapter_files=parts.model.adapter_files,
                       marker=parts.model.media_marker or None,
                       serves_decisions=parts.decision_caps is not None)
    model.adapters.set_scales(parts.model.adapters.scales)  # as the fleet last set them
    engine = new_engine(parts.settings, model, parts.model_id, parts.worker_id,
                        parts.publisher)
    carry_counters(old.metrics, engine.metrics)
    engine.on_slots_changed = old.on_slots_changed
    engine.on_tier_state = old.on_tier_state
    engine.start()
    if parts.embedder is not None:  # an embedding or rerank worker: its embedder too
        embedder = Embedder(model, not wait_policy_by_hand(os.environ))
        carry_counters(parts.embedder.metrics, embedder.metrics)
        embedder.start()
        parts.embedder = embedder
    parts.model, parts.engine = model, engine


class Sleeper:
    """Puts the worker's model to sleep when idle and wakes it for the next job."""

    def __init__(self, parts: WorkerParts, registry: Registry, entry: RegistryEntry,
                 idle_s: float) -> None:
        """`entry`: the worker's registry entry, rewritten with `sleeping` as it changes."""
        self._parts = parts
        self._registry = registry
        self._entry = entry
        self.clock = IdleClock(idle_s)
        self.sleeping = False
        self._lock = asyncio.Lock()
        """Held while the model unloads or loads."""

    @contextlib.asynccontextmanager
    async def job(self) -> AsyncIterator[None]:
        """Around every job: it counts as activity and finds the model loaded."""
        self.clock.begin()
        try:
            if self.sleeping or self._lock.locked():
                await self.wake()
            yield
        finally:
            self.clock.end()

    async def run(self) -> None:
        """The idle timer (runs for the worker's life)."""
        while True:
            await asyncio.sleep(max(self.clock.left(), CHECK_EVERY_S) if not self.sleeping
                                else CHECK_EVERY_S)
            if not self.sleeping and self.clock.due():
                await self.sleep()

    async def sleep(self) -> None:
        parts = self._parts
        async with self._lock:
            if self.sleeping or not self.clock.due() or parts.draining:
                return
            log.info("worker %s: idle for %g s, unloading %s", parts.worker_id,
                     self.clock.idle_s, parts.model_id)
            self.sleeping = True
            await asyncio.to_thread(self._unload)
            await self._publish(True)
            log.info("worker %s: sleeping", parts.worker_id)

    def _unload(self) -> None:
        engine = self._parts.engine
        engine.stop()
        if self._parts.embedder is not None:
            self._parts.embedder.stop()
        for slot in engine.slots:  # their KV is gone with the context
            slot.forget_tokens()
        if engine.prompt_cache is not None:  # sleep frees the host cache's states too
            engine.prompt_cache.clear()
        engine.model.close()
        release_freed_memory()

    async def wake(self) -> None:
        parts = self._parts
        async with self._lock:
            if not self.sleeping:
                return
            log.info("worker %s: a job came, loading %s again", parts.worker_id,
                     parts.model_id)
            started = time.monotonic()
            await asyncio.to_thread(reload_engine, parts)
            self.sleeping = False
            await self._publish(False)
            log.info("worker %s: awake after %.2f s", parts.worker_id,
                     time.monotonic() - started)

    async def _publish(self, sleeping: bool) -> None:
        """Rewrite the worker's registry entry now (its heartbeats carry it from then on) and
        tell `/models/sse` (a wake-up is `loaded` without `info`, as the spec shows)."""
        parts, entry = self._parts, self._entry
        entry.info = entry.info.model_copy(update={"sleeping": sleeping})
        event = status_event(parts.model_id, "sleeping" if sleeping else "loaded")
        try:
            await self._registry.heartbeat(entry.info)
            await parts.redis.publish(keys.MODELS_CHANNEL,
                                      json.dumps(event, separators=(",", ":")))
        except RedisError as error:  # the next heartbeat carries it
            log.warning("worker %s: cannot publish sleeping=%s (%s)", parts.worker_id,
                        sleeping, error)


def carry_counters(old: WorkerMetrics, new: WorkerMetrics) -> None:
    """The woken engine's counters start where the old one's stopped. Copied into the new
    engine's own object, not replaced by the old one: its parts (runs, prefill, decisions)
    hold the object they were built with, and counted into a replaced one no scrape saw."""
    for name in type(old).model_fields:
        setattr(new, name, getattr(old, name))
