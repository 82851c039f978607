"""arq's Worker, woken by a pub/sub message when a job is enqueued instead of polling every
`poll_delay` (which alone would add up to that much to every time to first token)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from arq import Worker
from arq.connections import ArqRedis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0


class WakeableWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wake = asyncio.Event()

    async def main(self) -> None:
        assert isinstance(self._pool, ArqRedis), "WakeableWorker needs a redis_pool"
        self.ctx["redis"] = self._pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        while True:
            self.wake.clear()
            try:
                await self._poll_iteration()
            except RedisError as error:  # Redis away: wait for it, do not die
                log.warning("queue %s: cannot poll Redis (%s); retrying", self.queue_name, error)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_delay_s)

    def _release_sem_dec_counter_on_complete(self) -> None:
        # A job ended, so there is room for another: look at the queue now.
        super()._release_sem_dec_counter_on_complete()
        self.wake.set()
