"""The scheduler process: periodic fleet housekeeping."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.registry import Registry

log = logging.getLogger(__name__)


async def run_housekeeping(redis_url: str, model_id: str) -> None:
    """Drop registry entries of workers whose heartbeats stopped, and log the fleet's size."""
    redis = open_redis(redis_url)
    registry = Registry(redis)
    seen = -1
    try:
        while True:
            try:
                workers = await registry.live_workers(model_id)
            except RedisError as error:  # Redis away: wait for it, do not exit
                log.warning("cannot read the registry (%s); retrying", error)
                await asyncio.sleep(keys.HEARTBEAT_EVERY_S)
                continue
            if len(workers) != seen:
                seen = len(workers)
                log.info("model %s: %d live workers, %d slots", model_id, seen,
                         sum(w.n_slots for w in workers))
            await asyncio.sleep(keys.HEARTBEAT_EVERY_S)
    finally:
        await redis.aclose()
