"""Waking one idle worker per queued job instead of every worker of the queue (issue 44: the
thundering herd: each wake cost every idle worker a claim script, so a job's Redis commands
grew with the idle workers).

A worker whose poll of a queue leaves it room (it took fewer jobs than it could: the queue held
no more) adds its own wake channel to the queue's waiters (`keys.queue_waiters`, the most room
first) in the claim script itself (`WAIT_FOR_JOBS`, scheduler/leases.py
CLAIM_JOBS), so that a job queued after that claim cannot miss it; a poll that fills it takes it
out. Queuing a job (scheduler/enqueue.py ENQUEUE; `wake_queue` after a job is moved to a queue
or handed back) pops the waiter with the most room and publishes to its channel; a channel
nobody listens to any more (its worker died, or its connection is down) is dropped and the next
one tried. When
no worker waits, every worker of the queue is full: the queue's shared wake channel
(`keys.wake_channel`) tells them, as before, which costs a full worker no Redis command (its
poll finds no room) unless it may preempt (worker/process/preempt.py). A woken worker that
cannot take the job (it filled up meanwhile, or drains) passes the wake on (`WAKE`); a worker
that took as many jobs as it had room for looks at the queue again when one of its jobs ends.
Polling stays the safety net (a wake lost with its connection): every --poll-delay, or every
--idle-poll-delay while the worker waits among the waiters and its listener is subscribed."""

from __future__ import annotations

import time

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.contract import keys

WAKE_ONE = """
local function wake_one(waiters, everyone)
  while true do
    local popped = redis.call('ZPOPMIN', waiters)
    if #popped == 0 then break end
    if redis.call('PUBLISH', popped[1], '1') > 0 then return 1 end
  end
  if everyone then redis.call('PUBLISH', everyone, '1') end
  return 0
end
"""
"""`wake_one(waiters, everyone)`: publish to the channel of the first worker of `waiters`
(WAIT_FOR_JOBS: the most room) that still listens (1), else on `everyone` (a channel, or nil:
nobody) (0)."""

WAIT_FOR_JOBS = """
local function wait_for_jobs(waiters, channel, room, ttl_ms)
  if room > 0 then
    -- the set's expiry set again only when a worker begins to wait (issue 44: a PEXPIRE
    -- with each idle poll was one of its six commands)
    if redis.call('ZADD', waiters, -room * 1e10 + now_ms / 1000, channel) == 1 then
      redis.call('PEXPIRE', waiters, ttl_ms)
    end
  else
    redis.call('ZREM', waiters, channel)
  end
end
"""
"""`wait_for_jobs(waiters, channel, room, ttl_ms)`: a worker's wake `channel` joins a queue's
`waiters` while it has `room` for more jobs (a claim that found no more), else leaves them
(needs LUA_NOW_MS's now_ms). The set lives WAITERS_TTL_MS after a worker last began to wait
(not after each look of a waiting one): a fleet idle that long loses it, and the jobs queued
before each worker's next poll puts it back are told on the queue's shared channel, which
every worker of the queue hears. The score puts the worker with the most room first, then the
one whose last look is oldest: jobs spread over the workers (a new job goes to an idle worker
rather than to one that runs others, whose loop it would share) instead of piling on the
worker that began to wait first."""

WAKE = WAKE_ONE + """
-- KEYS[1]: a queue's waiters; ARGV[1]: the queue's shared wake channel ("": none).
-- Wakes the first waiting worker (or, with none waiting, the queue's full workers).
local everyone = ARGV[1]
if everyone == '' then everyone = nil end
return wake_one(KEYS[1], everyone)
"""

LEAVE = """
-- KEYS[1]: a queue's waiters; ARGV[1]: a worker's wake channel. The worker stops waiting.
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

WAITERS_TTL_MS = int(keys.JOB_TTL_S * 1000)
"""A queue's waiters expire with a job's TTL after a worker last began to wait (a model whose
workers all went away leaves no set behind)."""

async def wake_queue(redis: Redis, queue_name: str) -> bool:
    """Wake one worker waiting on `queue_name` (a job was just put there); False: none waited
    (its full workers were told on the shared channel)."""
    woken = await redis.eval(  # type: ignore[misc]
        WAKE, 1, keys.queue_waiters(queue_name), keys.wake_channel(queue_name))
    return bool(woken)


REWAKE = WAKE_ONE + """
-- KEYS: a queue, its waiters, a job's arq in-progress key; ARGV[1]: the job's id. A job still
-- queued there and held by nobody wakes one more waiting worker (none waits: nothing). The
-- waiters first: a job waits unclaimed mostly because every worker is full, when none waits
-- (issue 44: a look at the job, then at the waiters, was 3 commands a second a queued job).
if redis.call('ZCARD', KEYS[2]) == 0 then return 0 end
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
return wake_one(KEYS[2], nil)
"""

REWAKE_EVERY_S = 1.0
"""How long a queued job waits unclaimed before its api wakes one more waiting worker."""


class Rewake:
    """Wakes one more waiting worker, every REWAKE_EVERY_S, for a job that waits unclaimed in
    its queue while a worker waits for jobs. A wake popped a waiter whose channel Redis still
    counted as heard, but its worker may not be listening: frozen (SIGSTOP, swapped out), or
    its connection half-open. That waiter left the set with the pop, so the next wake goes to
    another; without this the job would wait for an idle worker's safety poll
    (--idle-poll-delay, 30 s)."""

    def __init__(self, redis: Redis, queue_name: str, job_id: str) -> None:
        self._redis, self._queue, self._job_id = redis, queue_name, job_id
        self._next = time.monotonic() + REWAKE_EVERY_S

    async def look(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + REWAKE_EVERY_S
        await self._redis.eval(  # type: ignore[misc]
            REWAKE, 3, self._queue, keys.queue_waiters(self._queue),
            in_progress_key_prefix + self._job_id, self._job_id)
