"""A model's global LoRA scales on Redis (POST /lora-adapters): the api sets them for every
worker of the model, a worker reads them when told and when it starts or wakes.

Owns: the key that holds them (keys.lora_scales), the notice on keys.LORA_CHANNEL, and the
api's wait until the model's live workers show them in their registry entries (llama-server
answers POST /lora-adapters once its one context has the new scales; a request sent after the
answer gets them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pydantic import TypeAdapter, ValidationError
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.registry import WorkerInfo

APPLY_WAIT_S = 5.0
"""How long POST /lora-adapters waits for every live worker to show the new scales."""
POLL_S = 0.02

_SCALES = TypeAdapter(list[float])


async def read_scales(redis: Redis, model_id: str) -> list[float] | None:
    """The model's global scales as last set (None: never set, or unreadable)."""
    body = await redis.get(keys.lora_scales(model_id))
    if body is None:
        return None
    try:
        return _SCALES.validate_json(body)
    except ValidationError:
        return None


async def set_scales(redis: Redis, model_id: str, scales: list[float],
                     workers_of: Callable[[], Awaitable[list[WorkerInfo]]]) -> bool:
    """Store the scales, tell the model's workers, and wait until every live worker's entry
    shows them (True) or APPLY_WAIT_S passed (False: the late ones apply them on their own,
    from the key)."""
    await redis.set(keys.lora_scales(model_id), _SCALES.dump_json(scales))
    await redis.publish(keys.LORA_CHANNEL, model_id)
    deadline = time.monotonic() + APPLY_WAIT_S
    while True:
        workers = await workers_of()
        if all([a.scale for a in w.lora] == scales for w in workers if w.lora):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
