"""The api's enqueue script (scheduler/client.py JobClient._enqueue): the queue's bound, arq's
enqueue_job, the job's place in its queue's order and its tenant's fair share, and the wake of
one worker, in one step.

Owns: the Lua of that step. Does not own: the parts it is built of (the order:
scheduler/queue_order.py; the fair tags: scheduler/fair_share.py; the wake:
scheduler/wake.py; the preemption call: scheduler/preempt_call.py; the bound's index:
scheduler/queue_index.py)."""

from __future__ import annotations

from scheduler.contract import keys
from scheduler.fair_share import FAIR_TAG
from scheduler.lua_leases import LEASES_OF
from scheduler.preempt_call import CALL_PREEMPTOR
from scheduler.queue_index import INDEXED_WAITING
from scheduler.queue_order import ORDER_ADD
from scheduler.redis_clock import LUA_NOW_MS
from scheduler.wake import WAKE_ONE

ENQUEUE = (LUA_NOW_MS + LEASES_OF + INDEXED_WAITING + ORDER_ADD + FAIR_TAG + WAKE_ONE
           + CALL_PREEMPTOR + """
-- KEYS: arq's job key, the job's arq result key, the queue, the queue's order
-- (scheduler/queue_order.py), the model's fair state (scheduler/fair_share.py), the model's
-- index of queued jobs (scheduler/queue_index.py), the queue's preemptors
-- (scheduler/preempt_call.py), then the queues whose waiting jobs the
-- bound counts (none: no bound); ARGV: job id, (unused), expiry (ms), the job as arq's
-- serialize_job wrote it, the queue's waiters, the bound (-1: none), the job's priority,
-- arq's in-progress prefix, its tenant, its cost / weight, the queue's shared wake channel,
-- whether the job goes in the model's index ('1': the queue is one the model's bound counts;
-- the bound is then counted from the index, else queue by queue), whether a full worker may
-- be called to preempt for it ('1': a completion in the model's slot queue), the field of
-- the fair state that says when the queue's keys last had their expiry set ('': none, set it
-- with every job: scheduler/fair_share.py fair_tag).
-- The job's score is Redis's now (TIME), not the pod's clock; its order score its start tag
-- in its tenant's fair share.
-- The room check and arq's enqueue_job in one step, so requests that arrive together cannot
-- pass the check together: count the due jobs no worker holds in the counted queues (as
-- scheduler/leases.py WAITING_JOBS does); at the bound, refuse. Else no second job under an
-- id whose job or result key exists: PSETEX the job, ZADD it to the queue and its order,
-- then wake one worker waiting on the queue (scheduler/wake.py); none waits: call the one
-- full worker that may preempt a generation for it (scheduler/preempt_call.py), else tell the
-- queue's full workers on its shared channel.
-- Returns {1, waiting} if it enqueued the job, {0, waiting} if the id was taken, {-1,
-- waiting} if the queue is full.
local bound = tonumber(ARGV[6])
local in_index = ARGV[12] == '1'
local waiting = 0
local index_new = true  -- the model's index may begin with this job: set its expiry
if bound >= 0 and in_index then
  local counted = {}
  for q = 8, #KEYS do counted[KEYS[q]] = true end
  waiting, index_new = indexed_waiting(KEYS[6], counted, ARGV[8], ARGV[3])
elseif bound >= 0 then
  for q = 8, #KEYS do
    local offset = 0
    while true do
      local ids = redis.call('ZRANGEBYSCORE', KEYS[q], '-inf', now_score, 'LIMIT', offset, 500)
      if #ids == 0 then break end
      for _, lease in ipairs(leases_of(ARGV[8], ids, 1)) do
        if not lease then waiting = waiting + 1 end
      end
      offset = offset + 500
    end
  end
end
if bound >= 0 and waiting >= bound then return {-1, waiting} end
local fresh = redis.call('EXISTS', KEYS[1], KEYS[2]) == 0
if fresh then
  redis.call('PSETEX', KEYS[1], ARGV[3], ARGV[4])
  redis.call('ZADD', KEYS[3], now_score, ARGV[1])
  local stamp = nil
  if ARGV[14] ~= '' then stamp = ARGV[14] end
  local tag, due = fair_tag(KEYS[5], ARGV[9], tonumber(ARGV[10]), ARGV[3], stamp)
  if in_index then
    redis.call('ZADD', KEYS[6], now_score, KEYS[3] .. '\\n' .. ARGV[1])
    if due or index_new then redis.call('PEXPIRE', KEYS[6], ARGV[3]) end
  end
  order_add(KEYS[4], ARGV[7], ARGV[1], tag, ARGV[3], due)
end
if wake_one(ARGV[5], nil) == 0
    and not (ARGV[13] == '1' and call_preemptor(KEYS[7], ARGV[7]) == 1) then
  redis.call('PUBLISH', ARGV[11], '1')
end
if fresh then return {1, waiting} end
return {0, waiting}
""")


def refresh_stamp(model_id: str, queue_name: str) -> str:
    """The field of the model's fair state that says when the keys of `queue_name` last had
    their expiry set (scheduler/fair_share.py fair_tag); "" for a worker's own queue, which
    sets it with every job: its workers come and go, and a field of each would stay."""
    if queue_name.startswith(keys.worker_queue(model_id, "")):
        return ""
    return f"x:{queue_name}"
