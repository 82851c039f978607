"""The scheduler process: periodic fleet housekeeping."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from scheduler import keys
from scheduler.registry import Registry

log = logging.getLogger(__name__)


async def run_housekeeping(redis_url: str, model_id: str) -> None:
    """Drop registry entries of workers whose heartbeats stopped, and log the fleet's size."""
    redis = Redis.from_url(redis_url)
    registry = Registry(redis)
    seen = -1
    try:
        while True:
            workers = await registry.live_workers(model_id)
            if len(workers) != seen:
                seen = len(workers)
                log.info("model %s: %d live workers, %d slots", model_id, seen,
                         sum(w.n_slots for w in workers))
            await asyncio.sleep(keys.HEARTBEAT_EVERY_S)
    finally:
        await redis.aclose()
