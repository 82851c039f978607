"""Scale from zero (ours): a request for a model that has no live worker is held while one
starts (KEDA scales the model's worker Deployment up from zero on its waiting jobs).

The request's job is queued at once, as any other, so `llamaq:queue_depth{model}` counts it
and the autoscaler sees it; what is ours is the bound and the sign of life:

- it is held up to `--cold-start-timeout` (LLAMAQ_COLD_START_TIMEOUT, 300 s: an image pull, a
  model download from the store and a load); past it, with still no worker, the job leaves the
  queue and the request gets 503 with Retry-After (a stream that already opened gets the same
  error as its SSE `error` event);
- a streaming request opens its stream at once and gets `: waiting for a worker` SSE comments
  every COMMENT_EVERY_S seconds (clients and proxies ignore comments; they keep idle-timeout
  proxies from closing the connection), then its tokens;
- a chat request (its prompt is rendered with the template its worker reports) waits the same
  way before its job exists, counted as held too; a chat stream (OpenAI, Anthropic,
  Responses) opens at its first comment (api/streaming.py `early_stream`), and an error after
  that is its error event in its API's framing;
- the hold ends as soon as a worker of the model is live: from then the job waits in the queue
  as any other (bounded by `--timeout`);
- `llamaq:cold_start_waiting{model}` counts the requests held now, fleet-wide (a Redis sorted
  set, so every api pod reports the same number), `llamaq:cold_start_timeouts_total{model}`
  those that timed out. A held request with a queued job counts in `queue_depth` too.

`--cold-start-timeout 0` turns it off: a request for a model with no worker waits in the queue
up to `--timeout` without a sign (a single-model pod), and a router refuses a model that no
worker serves as llama-server does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.errors import LlamaqError, Unavailable

COMMENT = ": waiting for a worker\n\n"
COMMENT_EVERY_S = 5.0
DEFAULT_TIMEOUT_S = 300.0
RETRY_AFTER_S = 10
"""A refused request's Retry-After: the worker KEDA started is likely up soon after."""
COLD_CHECK_EVERY_S = 1.0
"""How often a held request looks at the registry for a live worker of its model."""
KEY_SLACK_S = 60
TIMEOUTS = "cold_start_timeouts"
"""Its field in the model's counters hash (keys.model_counters)."""

HasWorkers = Callable[[str], Awaitable[bool]]
"""Has the model (its id) a live worker now?"""
Tick = Callable[[], Awaitable[None]]


class ColdHold:
    """One held job (scheduler/job_hold.py `Hold`)."""

    def __init__(self, redis: Redis, model_id: str, job_id: str, timeout_s: float,
                 has_workers: HasWorkers) -> None:
        self._redis = redis
        self._model_id = model_id
        self._job_id = job_id
        self._timeout_s = timeout_s
        self._has_workers = has_workers
        self.deadline = time.monotonic() + timeout_s
        self._checked_at = time.monotonic()
        self._released = False

    async def cold(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at < COLD_CHECK_EVERY_S:
            return True
        self._checked_at = now
        return not await self._has_workers(self._model_id)

    async def release(self) -> None:
        if not self._released:
            self._released = True
            await self._redis.zrem(keys.cold_waiting(self._model_id), self._job_id)

    async def expired(self) -> LlamaqError:
        await self.release()
        await self._redis.hincrby(keys.model_counters(self._model_id),  # type: ignore[misc]
                                  TIMEOUTS, 1)
        return Unavailable(f"no worker of model '{self._model_id}' started within "
                           f"{self._timeout_s:g} s (--cold-start-timeout); retry later",
                           retry_after_s=RETRY_AFTER_S)


class ColdStart:
    """Holds the jobs of models that have no live worker (off with a timeout <= 0)."""

    def __init__(self, redis: Redis, timeout_s: float, has_workers: HasWorkers) -> None:
        self._redis = redis
        self.timeout_s = timeout_s
        self._has_workers = has_workers

    async def hold(self, model_id: str, job_id: str) -> ColdHold | None:
        """A hold for the job when its model has no live worker now (None: it has one, or
        holds are off)."""
        if self.timeout_s <= 0 or await self._has_workers(model_id):
            return None
        key = keys.cold_waiting(model_id)
        deadline_ms = int((time.time() + self.timeout_s) * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {job_id: deadline_ms})
            pipe.expire(key, int(self.timeout_s) + KEY_SLACK_S)
            await pipe.execute()
        return ColdHold(self._redis, model_id, job_id, self.timeout_s, self._has_workers)


    async def wait(self, model_id: str, tick: Tick | None = None) -> None:
        """Until the model has a live worker (a request that needs one before its job exists:
        a chat needs its worker's template), counted as held; past the timeout 503. `tick`
        is called every COMMENT_EVERY_S meanwhile (a chat stream's comment)."""
        if self.timeout_s <= 0 or await self._has_workers(model_id):
            return
        hold = await self.hold(model_id, f"request:{uuid.uuid4().hex}")
        assert hold is not None
        next_tick = time.monotonic() + COMMENT_EVERY_S
        try:
            while await hold.cold():
                if time.monotonic() >= hold.deadline:
                    raise await hold.expired()
                if tick is not None and time.monotonic() >= next_tick:
                    next_tick += COMMENT_EVERY_S
                    await tick()
                await asyncio.sleep(COLD_CHECK_EVERY_S)
        finally:
            await asyncio.shield(hold.release())


async def cold_counts(redis: Redis, model_id: str) -> tuple[int, int]:
    """The model's requests held now (fleet-wide; holds past their deadline, left by a pod that
    died, no longer count) and its cold-start timeouts so far."""
    now_ms = int(time.time() * 1000)
    key = keys.cold_waiting(model_id)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(key, "-inf", now_ms)
        pipe.zcard(key)
        pipe.hget(keys.model_counters(model_id), TIMEOUTS)
        result: list[Any] = await pipe.execute()
    return int(result[1]), int(result[2] or 0)
