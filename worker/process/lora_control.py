"""The global LoRA scales of a worker's model, kept as the fleet sets them: read from Redis at
start and whenever POST /lora-adapters announces new ones (scheduler/lora_scales.py), handed
to the model's adapters (worker/runtime/lora.py; the engine applies them before its next step) and
shown in the worker's registry entry at once.

Owns: taking the stored scales, rewriting the registry entry's `lora`.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from scheduler.lora_scales import read_scales
from scheduler.registry import Registry
from worker.jobs.parts import WorkerParts
from worker.process.loops import RegistryEntry

log = logging.getLogger(__name__)


class LoraControl:
    def __init__(self, parts: WorkerParts, registry: Registry, entry: RegistryEntry) -> None:
        self._parts = parts
        self._registry = registry
        self._entry = entry
        self._tasks: set[asyncio.Task[None]] = set()

    async def take_stored(self) -> None:
        """The model's stored global scales, if any were set for as many adapters as ours
        (else the flags' scales stay), into the adapters and the registry entry."""
        parts = self._parts
        adapters = parts.model.adapters
        if not adapters.adapters:
            return
        scales = await read_scales(parts.redis, parts.model_id)
        if scales is not None and not adapters.set_scales(scales):
            log.warning("worker %s: stored LoRA scales %s do not fit its %d adapters; kept "
                        "its own", parts.worker_id, scales, len(adapters.adapters))
        self._entry.info = self._entry.info.model_copy(update={"lora": adapters.infos()})

    def notice(self) -> None:
        """POST /lora-adapters changed the scales (called on the event loop by the listener)."""
        task = asyncio.create_task(self._apply())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self) -> None:
        try:
            await self.take_stored()
            await self._registry.heartbeat(self._entry.info)
        except RedisError as error:  # the next notice or start takes them
            log.warning("worker %s: cannot take the LoRA scales (%s)", self._parts.worker_id,
                        error)
