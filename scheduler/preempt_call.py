"""One preemption look per queued job (issue 47): the enqueue calls one full worker, the one
whose least urgent running generation is the least urgent of the model's, instead of every full
worker hearing the queue's shared wake and running a look (CLAIM_URGENT) of its own, the first
of which claimed the job and the others found nothing: commands that grew with the workers.

A worker whose every slot is busy keeps its preemption channel in the slot queue's
preemptors (`keys.queue_preemptors`), scored by the priority of the generation it would give up
(+inf: a batch line), and leaves them when a slot frees (ADVERTISE, run by the worker when its
slots change: worker/process/preempt_call.py). Queuing a job that no waiting worker takes
(scheduler/enqueue.py ENQUEUE) pops the preemptor of the largest score above the job's priority
and publishes on its channel (`call_preemptor`; a channel nobody listens to any more is dropped
and the next one tried); that worker looks and claims the job (scheduler/queue_order.py
CLAIM_URGENT), and joins the preemptors again with its next slot change. With none above the
job's priority the queue's shared wake goes out as before (`--preempt fair` workers look at it
for a tenant below its share; a `priority` worker does not).

A worker that joins the preemptors looks, in the same script, whether a job more urgent than
its score waits already (one queued before it joined, which called nobody): then it looks as
if called. So a job queued while a worker fills up is not left to the safety poll.

Owns: the Lua of both steps. Does not own: when a worker is full, its score, its look
(worker/process/preempt.py, worker/process/preempt_call.py), the queue's own scripts."""

from __future__ import annotations

from scheduler.queue_order import FREE_ENTRIES

CALL_PREEMPTOR = """
-- call_preemptor(preemptors, priority): pops the member of `preemptors` of the largest score
-- above `priority` (a worker that may preempt a generation for a job of that priority) and
-- publishes on it; a channel nobody listens to is dropped and the next one tried.
-- 1: a worker was called, 0: none.
local function call_preemptor(preemptors, priority)
  while true do
    local best = redis.call('ZREVRANGEBYSCORE', preemptors, '+inf', '(' .. priority,
                            'LIMIT', 0, 1)
    if #best == 0 then return 0 end
    redis.call('ZREM', preemptors, best[1])
    if redis.call('PUBLISH', best[1], priority) > 0 then return 1 end
  end
end
"""

ADVERTISE = FREE_ENTRIES + """
-- KEYS[1]: a slot queue's preemptors; then pairs of (queue, its order): the worker's online
-- queues. ARGV: the worker's preemption channel, its score ("": it leaves the preemptors),
-- arq's in-progress prefix, the set's expiry (ms).
-- Returns 1 when the worker joined and a job of a priority value below its score waits that no
-- worker holds (it should look now), else 0.
if ARGV[2] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
for q = 2, #KEYS, 2 do
  local queue, index = KEYS[q], KEYS[q + 1]
  for _, priority in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. ARGV[2])) do
    local free = {}
    if free_entries(queue, index .. ':' .. priority, ARGV[3], 1, free) > 0 then return 1 end
  end
end
return 0
"""
