"""The index of a model's queued jobs (scheduler/contract/event_keys.py model_queued), from which
the enqueue's backpressure bound counts the jobs that wait for the model's slots in a few
commands, however many of its workers are live.

The bound counts the due jobs no worker holds over the model's shared queue and its live
workers' own queues (routed and pinned jobs). Read queue by queue, that was a ZRANGEBYSCORE of
every live worker's own queue per job (issue 44: 12 of a job's commands with 10 workers, 1,000
with 1,000). The enqueue script adds each job of those queues to the model's index as well
(member `<queue>\\n<job>`, score the job's queue score); the bound reads the index by pages of
500, each page's leases in one MGET, then the jobs no worker holds in one ZMSCORE per queue
they were queued on (is the job still there?). A member whose job left its queue (it ended, was
cancelled, or was forgotten with its dead worker's queue) is dropped as the bound meets it; one
queued on a queue that is not counted (a dead worker's) is passed over, and every member goes
a job's TTL after its enqueue, when its job has expired anyway. What counts as waiting is
what the queue-by-queue count said: the index holds every job of those queues (a job moved from
a worker's queue to the shared one moves in the index too: MOVE_TO_SHARED), and each is checked
against its queue and its lease as that count did.

Owns: the Lua of the index (count, move) and the move of a routed job to the shared queue.
Does not own: the scripts that use it (scheduler/enqueue.py ENQUEUE), the lease helper
(scheduler/lua_leases.py)."""

from __future__ import annotations

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.contract import event_keys, keys
from scheduler.wake import wake_queue

INDEXED_WAITING = """
-- indexed_waiting(index, counted, prefix, ttl ms): how many jobs of the index wait: due, held
-- by no worker (no `prefix`..job key), still in their queue, and that queue in `counted` (a
-- set: queue name -> true); and whether the index held none (then the next member added
-- begins a new key: its expiry is to be set). Drops members older than `ttl` and those whose
-- job left its queue. Needs now_ms and now_score (scheduler/redis_clock.py) and leases_of
-- (scheduler/lua_leases.py).
local function indexed_waiting(index, counted, prefix, ttl)
  local cutoff = now_ms - tonumber(ttl)
  local waiting, offset, kept = 0, 0, 0
  while true do
    local scored = redis.call('ZRANGEBYSCORE', index, '-inf', now_score, 'WITHSCORES',
                              'LIMIT', offset, 500)
    if offset == 0 and #scored > 0 and tonumber(scored[2]) < cutoff then
      -- the oldest member is older than a job's TTL (its job expired): those go, and the
      -- page is read again (issue 44: a ZREMRANGEBYSCORE with every enqueue)
      redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. cutoff)
      scored = redis.call('ZRANGEBYSCORE', index, '-inf', now_score, 'WITHSCORES',
                          'LIMIT', 0, 500)
    end
    if #scored == 0 then break end
    local page = {}
    for i = 1, #scored, 2 do page[#page + 1] = scored[i] end
    local ids, queues = {}, {}
    for i, member in ipairs(page) do
      local cut = string.find(member, '\\n', 1, true) or 0
      queues[i] = string.sub(member, 1, cut - 1)
      ids[i] = string.sub(member, cut + 1)
    end
    local held = leases_of(prefix, ids, 1)
    local asked, order = {}, {}
    for i = 1, #page do
      local queue = queues[i]
      if not held[i] and counted[queue] then
        if not asked[queue] then
          asked[queue] = {}
          order[#order + 1] = queue
        end
        local list = asked[queue]
        list[#list + 1] = i
      end
    end
    local gone = {}
    for _, queue in ipairs(order) do
      local list, names = asked[queue], {}
      for k, i in ipairs(list) do names[k] = ids[i] end
      local scores = redis.call('ZMSCORE', queue, unpack(names))
      for k, i in ipairs(list) do
        if scores[k] then waiting = waiting + 1 else gone[#gone + 1] = page[i] end
      end
    end
    if #gone > 0 then redis.call('ZREM', index, unpack(gone)) end
    offset = offset + #page - #gone
    kept = kept + #page - #gone
    if #page < 500 then break end  -- the last page: no read of the empty one after it
  end
  return waiting, kept == 0
end
"""

INDEX_MOVE = """
-- index_move(index, from, to, id, score): the job's member follows it from queue `from` to
-- queue `to` (where it was indexed).
local function index_move(index, from, to, id, score)
  if redis.call('ZREM', index, from .. '\\n' .. id) == 1 then
    redis.call('ZADD', index, score, to .. '\\n' .. id)
  end
end
"""


def indexed(model_id: str, queue_name: str) -> bool:
    """Whether the enqueue indexes a job of `queue_name` (the model's shared slot queue and
    its workers' own queues: those the model's bound counts)."""
    return queue_name == keys.slot_queue(model_id) or queue_name.startswith(
        keys.worker_queue(model_id, ""))


def index_key(model_id: str) -> str:
    return event_keys.model_queued(model_id)


MOVE_TO_SHARED = INDEX_MOVE + """
-- KEYS: a worker's queue, the model's shared queue, its index (scheduler/queue_index.py);
-- ARGV: job id, (unused), arq's in-progress prefix. Moves the job if still queued there,
-- held by nobody, keeping its score (in the index too).
if redis.call('EXISTS', ARGV[3] .. ARGV[1]) == 1 then return 0 end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], score, ARGV[1])
index_move(KEYS[3], KEYS[1], KEYS[2], ARGV[1], score)
return 1
"""


async def move_to_shared(redis: Redis, model_id: str, worker_id: str, job_id: str) -> bool:
    """Move a job queued on a worker's own queue that nobody holds to the model's shared queue
    (and wake a worker waiting on it); False when it is held or no longer queued there."""
    shared = keys.slot_queue(model_id)
    moved = await redis.eval(  # type: ignore[misc]
        MOVE_TO_SHARED, 3, keys.worker_queue(model_id, worker_id), shared, index_key(model_id),
        job_id, "0", in_progress_key_prefix)
    if moved:
        await wake_queue(redis, shared)
    return bool(moved)
