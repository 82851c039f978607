"""Final results too big for Redis (over keys.RESULT_INLINE_MAX_BYTES of JSON) go to the object
store (storage/results.py); their event carries the key (StoredFinalEvent), so Redis never holds
a 90 MB tokenize or token-level embedding result for its event log's lifetime. Each stored key is
recorded in a Redis sorted set by Redis TIME before the object is written, and every worker
sweeps the set: keys past keys.STORED_RESULT_TTL_S are taken out of it by one script (so one
worker deletes each) and deleted from the store.

Owns: when a result is stored, its record, its deletion. Does not own: reading it back (the
api's scheduler/job_events.py)."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.contract.results import FinalEvent, StoredFinalEvent
from scheduler.redis_clock import STAMP
from storage.errors import StorageError
from storage.results import ResultStore, result_key

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 60.0
SWEEP_BATCH = 100

CLAIM_EXPIRED = """
-- KEYS[1]: the stored results' set; ARGV: age (s), how many. Takes the keys older than the
-- age out of the set and returns them (the caller deletes their objects).
local t = redis.call('TIME')
local cutoff = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[1])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
if #old > 0 then redis.call('ZREM', KEYS[1], unpack(old)) end
return old
"""


class ResultOffload:
    def __init__(self, redis: Redis, store: ResultStore,
                 inline_max: int = keys.RESULT_INLINE_MAX_BYTES,
                 ttl_s: float = keys.STORED_RESULT_TTL_S) -> None:
        self._store = store
        self.inline_max = inline_max
        self.ttl_s = ttl_s
        self._claim = redis.register_script(CLAIM_EXPIRED)
        self._stamp = redis.register_script(STAMP)

    async def event(self, job_id: str, event: FinalEvent) -> FinalEvent | StoredFinalEvent:
        """`event` as it goes to Redis: itself, or a StoredFinalEvent when its result is big.
        A store that fails leaves it inline (delivered, at Redis's cost)."""
        data = event.result.model_dump_json().encode()
        if len(data) <= self.inline_max:
            return event
        try:
            key = await self.store(job_id, data)
        except (StorageError, OSError, RedisError) as error:
            log.warning("job %s: could not store its %d-byte result (%s); it goes by Redis",
                        job_id, len(data), error)
            return event
        return StoredFinalEvent(key=key, size=len(data))

    async def store(self, job_id: str, data: bytes) -> str:
        key = result_key(job_id)
        await self._stamp(keys=[keys.stored_results()], args=[key])  # first: never orphaned
        await asyncio.to_thread(self._store.put, job_id, data)
        return key

    async def sweep(self) -> list[str]:
        """Delete (up to SWEEP_BATCH of) the stored results past their lifetime; their keys."""
        old = [k.decode() for k in await self._claim(keys=[keys.stored_results()],
                                                      args=[self.ttl_s, SWEEP_BATCH])]
        for key in old:
            try:
                await asyncio.to_thread(self._store.delete, key)
            except StorageError as error:
                log.warning("could not delete the stored result %s (%s)", key, error)
        return old

    async def sweep_forever(self) -> None:
        while True:
            try:
                while len(await self.sweep()) == SWEEP_BATCH:
                    pass
            except RedisError as error:
                log.warning("stored results sweep: %s; retrying", error)
            await asyncio.sleep(SWEEP_EVERY_S)
