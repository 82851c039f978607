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

import asyncio
import logging
import time

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.contract import keys

log = logging.getLogger(__name__)

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


REWAKES = WAKE_ONE + """
-- KEYS, per queue: the queue, its waiters, then the arq in-progress key of each of its jobs;
-- ARGV, per queue: how many jobs, then their ids. Per queue: when a worker waits and one of
-- the jobs is still queued there and held by nobody, one more waiting worker is woken (at
-- most one a queue). The waiters first: a job waits unclaimed mostly because every worker is
-- full, when none waits (issue 44: then one ZCARD a queue, not 4 commands a job).
local woken, k, a = 0, 1, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  if redis.call('ZCARD', KEYS[k + 1]) > 0 then
    for i = 1, n do
      if redis.call('ZSCORE', KEYS[k], ARGV[a + i])
          and redis.call('EXISTS', KEYS[k + 1 + i]) == 0 then
        woken = woken + wake_one(KEYS[k + 1], nil)
        break
      end
    end
  end
  k, a = k + 2 + n, a + 1 + n
end
return woken
"""

REWAKE_EVERY_S = 1.0
"""How long a queued job waits unclaimed before its api wakes one more waiting worker, and
how often a pod wakes one more for each queue that holds such jobs."""


class Rewakes:
    """One pod's rewakes (one round trip a tick for all of its jobs, issue 44): a job that
    waits unclaimed in its queue asks (`ask`, from its silent-wait check); every
    REWAKE_EVERY_S at most, for each queue whose jobs asked, one more waiting worker is woken
    while one of them is still unclaimed. A wake popped a waiter whose channel Redis still
    counted as heard, but its worker may not be listening: frozen (SIGSTOP, swapped out), or
    its connection half-open. That waiter left the set with the pop, so the next wake goes to
    another; without this the job would wait for an idle worker's safety poll
    (--idle-poll-delay, 30 s). Each job asked on its own cost one script a second: ~9 % of the
    api during a 2,000-stream ramp."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(REWAKES)
        self._asked: dict[str, dict[str, None]] = {}
        """The jobs that asked since the last tick, by queue."""
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0

    def ask(self, queue_name: str, job_id: str) -> None:
        """`job_id` waits unclaimed in `queue_name`: wake one more worker at the next tick."""
        self._asked.setdefault(queue_name, {})[job_id] = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._rewakes())

    async def _rewakes(self) -> None:
        try:
            while self._asked:
                await asyncio.sleep(max(0.0, self._last + REWAKE_EVERY_S - time.monotonic()))
                asked, self._asked = self._asked, {}
                self._last = time.monotonic()
                names: list[str] = []
                args: list[str | int] = []
                for queue_name, job_ids in asked.items():
                    names += [queue_name, keys.queue_waiters(queue_name)]
                    names += [in_progress_key_prefix + job_id for job_id in job_ids]
                    args += [len(job_ids), *job_ids]
                try:
                    await self._script(keys=names, args=args)
                except RedisError as error:  # Redis away: the jobs ask again at their next look
                    log.warning("rewaking %d queues: %r", len(asked), error)
        finally:
            self._task = None
