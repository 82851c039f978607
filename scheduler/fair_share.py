"""Weighted fair queueing between tenants where jobs wait (issue 47 item 2): start-time fair
queueing (SFQ, Goyal et al. 1996) on tokens, its bookkeeping in Redis so that every api pod and
every worker of a model shares it.

A model has a virtual time `v` (tokens per unit of weight) and each tenant a finish tag `f`:
a job queued by a tenant of weight `w` whose cost is `c` tokens gets the start tag
`s = max(v, f, the tenant's last start tag)`, and the tenant's finish tag becomes `s + c / w`.
Within a priority, a queue's jobs are taken by start tag (it is their order score,
scheduler/queue_order.py); a worker's claim moves `v` up to the largest start tag it took.
So a tenant that queued many jobs has tags far ahead of `v`, and one that queues a job now gets
`v`: it waits behind the jobs already taken and those of start tags at most `v`, not behind the
other's backlog; over a busy period each tenant's share of the tokens follows its weight.
With one tenant the tags grow with arrival: first come, first served, as before.

A job's cost is estimated when it is queued (its prompt's characters / 4 plus its `n_predict`,
or DEFAULT_PREDICT_ESTIMATE when it names none); when it ends, the api pod that waited for it
corrects its tenant's finish tag by what it really took (prompt + generated tokens, as
--tenants meters them).

Owns: the Lua of the tags (FAIR_TAG, run by the enqueue script; FAIR_ADVANCE, run by the claim
script), the cost estimate, the correction. Does not own: the order sets (queue_order.py)."""

from __future__ import annotations

from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.jobs import CompletionJob

DEFAULT_PREDICT_ESTIMATE = 256
"""The generated tokens a completion that names no `n_predict` is expected to take."""
CHARS_PER_TOKEN = 4
DEFAULT_TENANT = "default"
KEY_REFRESH_MS = 60_000
"""How often at most an enqueue sets again the expiry of its queue's order sets, its model's
fair state and index (a job's TTL): they live at least that TTL less this after the last job
queued, as every queued job's payload does its TTL."""

FAIR_TAG = """
-- fair_tag(state, tenant, cost / weight, ttl ms, stamp): the start tag of a job the tenant
-- queues now (scheduler/fair_share.py); the tenant's finish tag moves past it. Returns also
-- whether the keys of the job's queue are due to have their expiry set again: `stamp` (a
-- field of the state, one a queue: KEY_REFRESH_MS) says when that was last done, read and
-- written with the tag (issue 44: four PEXPIREs with every enqueue); nil: always. Needs
-- now_ms (scheduler/redis_clock.py).
local function fair_tag(state, tenant, cost, ttl, stamp)
  local found = redis.call('HMGET', state, 'v', 'f:' .. tenant, 's:' .. tenant, stamp or 'v')
  local start = math.max(tonumber(found[1] or '0'), tonumber(found[2] or '0'),
                         tonumber(found[3] or '0'))
  local due = stamp == nil or not found[4]
              or now_ms - tonumber(found[4]) >= KEY_REFRESH_MS
  if due and stamp then
    redis.call('HSET', state, 'f:' .. tenant, tostring(start + cost), 's:' .. tenant,
               tostring(start), stamp, tostring(now_ms))
  else
    redis.call('HSET', state, 'f:' .. tenant, tostring(start + cost), 's:' .. tenant,
               tostring(start))
  end
  if due then redis.call('PEXPIRE', state, ttl) end
  return start, due
end
""".replace("KEY_REFRESH_MS", str(KEY_REFRESH_MS))

FAIR_ADVANCE = """
-- fair_advance(state, tag): a job of start tag `tag` was taken: the virtual time is at least it.
local function fair_advance(state, tag)
  local v = tonumber(redis.call('HGET', state, 'v') or '0')
  if tag > v then redis.call('HSET', state, 'v', tostring(tag)) end
end
"""

SETTLE = """
-- KEYS[1]: a model's fair state; ARGV: tenant, correction (tokens / weight). The tenant's
-- finish tag moves by the correction (a job took more or fewer tokens than estimated).
local f = redis.call('HGET', KEYS[1], 'f:' .. ARGV[1])
if f then
  redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], tostring(tonumber(f) + tonumber(ARGV[2])))
end
return 0
"""


def estimated_cost(job: CompletionJob) -> int:
    """The tokens `job` is expected to take: its prompt (characters / 4, token ids as they
    are) and what it may generate."""
    if isinstance(job.prompt, str):
        prompt = len(job.prompt) // CHARS_PER_TOKEN
    else:
        prompt = sum(1 if isinstance(p, int) else len(str(p)) // CHARS_PER_TOKEN
                     for p in job.prompt)
    predict = job.n_predict if job.n_predict is not None and job.n_predict >= 0 \
        else DEFAULT_PREDICT_ESTIMATE
    return max(1, prompt + predict)


def fair_args(job: object) -> tuple[str, float]:
    """The tenant and the weighted cost (tokens / weight) of a job on its way to a queue
    (a job that is not a completion costs 1 token of the default tenant)."""
    if not isinstance(job, CompletionJob):
        return DEFAULT_TENANT, 1.0
    return job.tenant or DEFAULT_TENANT, estimated_cost(job) / job.weight


async def settle(redis: Redis, job: CompletionJob, took: int) -> None:
    """Correct the finish tag of `job`'s tenant by what it took (`took` tokens) against its
    estimate."""
    correction = (took - estimated_cost(job)) / job.weight
    if correction:
        await redis.eval(SETTLE, 1, keys.fair_state(job.model),  # type: ignore[misc]
                         job.tenant or DEFAULT_TENANT, repr(correction))
