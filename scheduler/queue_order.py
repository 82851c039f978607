"""The order in which a queue's waiting jobs are taken: by priority (lower first), then by
their order score (docs/fairness.md).

arq keeps a queue as one sorted set scored by enqueue time (Redis's TIME): what counts waiting
jobs and measures their wait reads it, and it stays as it is. Beside it each queue has an order:
`keys.queue_order(queue)`, a sorted set of the priorities whose jobs wait (score and member the
priority), and per priority `queue_order_of(queue, p)`, its jobs scored by their order
score. The enqueue script adds a job to both in one step (ORDER_ADD); a worker's claim script
walks the order, priorities ascending, each by score (ORDER_CLAIM), and drops entries whose job
left the queue (it ended) as it meets them. A job in the queue but in no order set (one queued
by arq's own enqueue_job) is still taken, after the ordered ones, by enqueue time: the claim
falls back to the queue itself when the order sets hold fewer jobs than the queue.

A job that is handed back (a draining worker, a preemption) keeps its queue and order entries:
it is taken again before every job of its priority queued after it.

Owns: the Lua of both steps. Does not own: the order score, a job's start tag in its tenant's
fair share of the model (scheduler/fair_share.py), the
queue's own scripts (scheduler/enqueue.py ENQUEUE, scheduler/leases.py CLAIM_JOBS)."""

from __future__ import annotations

from scheduler.contract import keys
from scheduler.fair_share import FAIR_ADVANCE
from scheduler.redis_clock import LUA_NOW_MS

ORDER_ADD = """
-- order_add(index, priority, job id, order score, ttl ms, due): the job in its priority's
-- order set; both sets' expiry set (a job's TTL) when `due` (scheduler/fair_share.py
-- fair_tag: at most once a KEY_REFRESH_MS) or when the priority is new to the index (its set
-- begins: a claim takes a priority out of the index when its set empties, in the same step).
local function order_add(index, priority, id, score, ttl, due)
  local ordered = index .. ':' .. priority
  local new = redis.call('ZADD', index, priority, priority) == 1
  redis.call('ZADD', ordered, score, id)
  if due or new then
    redis.call('PEXPIRE', index, ttl)
    redis.call('PEXPIRE', ordered, ttl)
  end
end
"""

ORDER_CLAIM = """
-- order_claim(queue, index, wanted, in-progress prefix, take): calls take(id, queue score)
-- for up to `wanted` waiting jobs no worker holds, priorities ascending, each by its order
-- score; drops order entries whose job left the queue. Reads the order by pages of 200, each
-- page's queue scores and leases in two commands (ZMSCORE, MGET). Returns how many it took, whether
-- the order sets hold fewer jobs than the queue (some job is in none: look at the queue too),
-- and the largest order score it took (nil: none). A page shorter than 200 entries is the
-- set's last: no read of the empty one after it, and the set's size is then known (issue 44:
-- the empty page and a ZCARD were 2 of a claim's ~12 commands).
local function order_claim(queue, index, wanted, prefix, take)
  local n = 0
  local ordered_jobs = 0
  local top = nil
  local priorities = redis.call('ZRANGE', index, 0, -1)
  for _, priority in ipairs(priorities) do
    if n >= wanted then return n, false, top end
    local ordered = index .. ':' .. priority
    local offset = 0
    local left = nil
    while n < wanted do
      local page = redis.call('ZRANGE', ordered, offset, offset + 199, 'WITHSCORES')
      if #page == 0 then
        left = offset
        break
      end
      -- a page's queue scores and leases in one ZMSCORE and one MGET (issue 44: a ZSCORE
      -- and an EXISTS an entry, running jobs included, were most of a job's commands)
      local ids, held = {}, {}
      for i = 1, #page, 2 do
        ids[#ids + 1] = page[i]
        held[#held + 1] = prefix .. page[i]
      end
      local scores = redis.call('ZMSCORE', queue, unpack(ids))
      held = redis.call('MGET', unpack(held))
      local gone = {}
      for k = 1, #ids do
        local id, score = ids[k], scores[k]
        if not score then
          gone[#gone + 1] = id
        elseif not held[k] then
          take(id, score)
          local tag = tonumber(page[2 * k])
          if top == nil or tag > top then top = tag end
          n = n + 1
          if n >= wanted then break end
        end
      end
      if #gone > 0 then redis.call('ZREM', ordered, unpack(gone)) end
      offset = offset + #page / 2 - #gone
      if #page < 400 and n < wanted then
        left = offset
        break
      end
    end
    -- left nil: it stopped with all it wanted, so the set holds a job it took (not empty),
    -- and the size is not needed (the next priority returns at once)
    if left == 0 then redis.call('ZREM', index, priority) end
    ordered_jobs = ordered_jobs + (left or 0)
  end
  return n, n < wanted and redis.call('ZCARD', queue) > ordered_jobs, top
end
"""


def queue_order_of(queue_name: str, priority: int) -> str:
    """The order set of a queue's jobs of one priority (as ORDER_ADD names it)."""
    return f"{keys.queue_order(queue_name)}:{priority}"


def claim_keys(queue_name: str, model_id: str = "") -> list[str]:
    """The KEYS of scheduler/leases.py CLAIM_JOBS for `queue_name` of `model_id` (its fair
    state, scheduler/fair_share.py: "" for none)."""
    found = [queue_name, keys.queue_order(queue_name)]
    return [*found, keys.fair_state(model_id)] if model_id else found


def job_priority(job: object) -> int:
    """A job's priority in its queue: a completion's `priority` (None: 0), else 0."""
    priority = getattr(job, "priority", None)
    return priority if isinstance(priority, int) else 0


FREE_ENTRIES = """
-- free_entries(queue, ordered, prefix, wanted, out): appends {id, order score, queue score} to
-- `out` for up to `wanted` entries of the order set `ordered`, in order, whose job is in `queue`
-- and held by no worker (no `prefix`..id key); returns how many. Reads the set by pages of
-- 200, each page's queue scores and leases in two commands, not two an entry: the running
-- jobs' entries come first and a preemption's look passes them all (issue 47).
local function free_entries(queue, ordered, prefix, wanted, out)
  local n, offset = 0, 0
  while n < wanted do
    local page = redis.call('ZRANGE', ordered, offset, offset + 199, 'WITHSCORES')
    if #page == 0 then break end
    local ids, leases = {}, {}
    for i = 1, #page, 2 do
      ids[#ids + 1] = page[i]
      leases[#leases + 1] = prefix .. page[i]
    end
    local queued = redis.call('ZMSCORE', queue, unpack(ids))
    local held = redis.call('MGET', unpack(leases))
    for j = 1, #ids do
      if queued[j] and not held[j] then
        out[#out + 1] = {ids[j], page[2 * j], queued[j]}
        n = n + 1
        if n >= wanted then break end
      end
    end
    offset = offset + #ids
  end
  return n
end
"""

CLAIM_URGENT = LUA_NOW_MS + FREE_ENTRIES + FAIR_ADVANCE + """
-- KEYS[1]: the model's fair state; then pairs of (queue, its order); ARGV: a priority (only
-- jobs of a lower value count; "+inf": any), arq's in-progress prefix, the lease (ms).
-- Claims the most urgent waiting job of those queues that no worker holds, as a poll's claim
-- does (its in-progress key for the lease; the model's virtual time up to its start tag): the
-- worker that looked starts it at once in the seat of the generation it preempts
-- (worker/process/preempt.py), so that neither the victim's hand back nor a poll is on the
-- waiting job's way to a slot, and one waiting job makes one worker preempt one generation.
-- Returns {job id, priority, queue score, queue number (1-based pair)}, or {} when none waits.
local best, best_priority, best_q = nil, nil, nil
for q = 2, #KEYS, 2 do
  local queue, index = KEYS[q], KEYS[q + 1]
  for _, priority in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. ARGV[1])) do
    local p = tonumber(priority)
    if best_priority ~= nil and p >= best_priority then break end
    local free = {}
    if free_entries(queue, index .. ':' .. priority, ARGV[2], 1, free) > 0 then
      best, best_priority, best_q = free[1], p, q
      break
    end
  end
end
if best == nil then return {} end
redis.call('PSETEX', ARGV[2] .. best[1], ARGV[3], '1')
fair_advance(KEYS[1], tonumber(best[2]))
return {best[1], tostring(best_priority), best[3], tostring(best_q / 2)}
"""

CANDIDATES = LUA_NOW_MS + FREE_ENTRIES + """
-- KEYS: pairs of (queue, its order); ARGV: a priority (jobs of at most this value count),
-- arq's in-progress prefix, how many to return at most per queue.
-- The waiting jobs no worker holds, per queue by priority then order:
-- {queue number (1-based pair), job id, priority, order score, queue score, ...}. Claims
-- nothing (CLAIM_ONE does).
local found = {}
local per_queue = tonumber(ARGV[3])
for q = 1, #KEYS, 2 do
  local queue, index = KEYS[q], KEYS[q + 1]
  local n = 0
  for _, priority in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', ARGV[1])) do
    if n >= per_queue then break end
    local free = {}
    n = n + free_entries(queue, index .. ':' .. priority, ARGV[2], per_queue - n, free)
    for _, entry in ipairs(free) do
      found[#found + 1] = tostring((q + 1) / 2)
      found[#found + 1] = entry[1]
      found[#found + 1] = priority
      found[#found + 1] = entry[2]
      found[#found + 1] = entry[3]
    end
  end
end
return found
"""

CLAIM_ONE = FAIR_ADVANCE + """
-- KEYS[1]: the model's fair state; KEYS[2]: a waiting job's queue; KEYS[3..]: the order sets
-- a running job it displaces may be in; ARGV: the waiting job's id, arq's in-progress prefix,
-- the lease (ms), its order score, the running job's id.
-- Claims the waiting job (as CLAIM_URGENT does) unless it left the queue or a worker holds it
-- now, and moves the running job's order entry (where it has one) just behind it, so that
-- the running job, back in its queue, does not go before the waiting job's peers: 1, else 0.
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
if redis.call('EXISTS', ARGV[2] .. ARGV[1]) == 1 then return 0 end
redis.call('PSETEX', ARGV[2] .. ARGV[1], ARGV[3], '1')
fair_advance(KEYS[1], tonumber(ARGV[4]))
local behind = tonumber(ARGV[4]) + math.max(1e-6, math.abs(tonumber(ARGV[4])) * 1e-9)
for k = 3, #KEYS do
  redis.call('ZADD', KEYS[k], 'XX', string.format('%.17g', behind), ARGV[5])
end
return 1
"""


def urgent_keys(model_id: str, queue_names: list[str]) -> list[str]:
    """The KEYS of CLAIM_URGENT: the model's fair state, then each queue and its order."""
    return [keys.fair_state(model_id),
            *(key for name in queue_names for key in claim_keys(name))]
