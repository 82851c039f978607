"""A leased job's events go to Redis only while this worker holds the job's lease.

A worker starved of CPU (not dead) can miss its lease renewals: the lease lapses, another
worker takes the job and continues it from the job's event log, and the starved worker, once it
runs again, would write on: two runs numbering events in one sequence, each seq taken by
whichever run came first, so a client reading in seq order could skip a token (one run's seq s
is the other's s + 1). The checks and the writes are one Lua script per batch (atomic): the
events of a run whose lease is gone are never logged nor announced, and the continuing
worker, which takes the lease before it reads the log, reads every event the old run wrote.

Owns: the lease-fenced write of a batch's events (log, announcement, job state). Does not own:
the numbering and retries (worker/wires/publisher.py), the leases (scheduler/leases.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from redis.asyncio.client import Pipeline

from scheduler.contract import event_keys, keys
from scheduler.contract.results import EventEnvelope

FENCED_WRITE = """
-- The events of several jobs, each written only while its lease is this worker's.
-- KEYS: per job its owner key, event log, state, pub/sub channel, watched flag.
-- ARGV: worker id, log ttl (s), state ttl (s), log maxlen, then per job: its number of
-- events n, sent, next seq, at (ms), the last event's MINID ('' = trim to maxlen), whether
-- to set the log's and state's expiry ('1': both, '2': the log's only, '0': neither),
-- whether to write the state ('1'/'0'), the channel of the api pod that waits for it
-- ('' = none), its id, whether its lease goes after its events ('1': its last event; the
-- owner read already says it is this worker's, issue 44: a script of its own read it
-- again), then n times: entry id, data, announcement. The last event's entry carries `a`,
-- the time (ms): the log says when its job last wrote, the state only now and then
-- (FencedJob.state).
-- A job's announcements go to its own channel when it has no pod's channel or when another
-- pod watches it (scheduler/client.py attach); to its pod's channel, all of a flush's jobs
-- of one pod in one message ('B' then, per event, "<job id> <length> <announcement>").
-- Returns per job 0 (nothing written: the lease is not this worker's) or 1.
local jobs = #KEYS / 5
-- The owners and watched flags of all the flush's jobs in one MGET (issue 44: a GET a job
-- was ~1 command a token), in chunks that Lua's unpack takes.
local found = {}
for first = 1, jobs, 500 do
  local names = {}
  for j = first, math.min(first + 499, jobs) do
    names[#names + 1] = KEYS[5 * j - 4]
    names[#names + 1] = KEYS[5 * j]
  end
  for _, value in ipairs(redis.call('MGET', unpack(names))) do found[#found + 1] = value end
end
local written = {}
local pods, frames = {}, {}
local at = 5
for j = 0, jobs - 1 do
  local log, state, channel = KEYS[5 * j + 2], KEYS[5 * j + 3], KEYS[5 * j + 4]
  local n = tonumber(ARGV[at])
  local sent, next_seq, at_ms, minid, ttls = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
                                             ARGV[at + 4], ARGV[at + 5]
  local state_too = ARGV[at + 6] == '1'
  local pod, id, release = ARGV[at + 7], ARGV[at + 8], ARGV[at + 9] == '1'
  at = at + 10
  if found[2 * j + 1] ~= ARGV[1] then
    written[#written + 1] = 0
  else
    local own = pod == '' or found[2 * j + 2]
    local mine = nil
    if pod ~= '' then
      mine = frames[pod]
      if not mine then
        mine = {}
        frames[pod] = mine
        pods[#pods + 1] = pod
      end
    end
    for i = 0, n - 1 do
      local e = at + 3 * i
      local added
      if i == n - 1 and minid ~= '' then
        added = redis.pcall('XADD', log, 'MINID', minid, ARGV[e], 'e', ARGV[e + 1],
                            'a', at_ms)
      elseif i == n - 1 then
        added = redis.pcall('XADD', log, 'MAXLEN', '~', ARGV[4], ARGV[e], 'e', ARGV[e + 1],
                            'a', at_ms)
      else
        added = redis.pcall('XADD', log, 'MAXLEN', '~', ARGV[4], ARGV[e], 'e', ARGV[e + 1])
      end
      -- a retry of a batch whose answer was lost finds its entries in: not an error
      if type(added) == 'table' and added.err
          and not string.find(added.err, 'equal or smaller') then
        return added
      end
      if own then redis.call('PUBLISH', channel, ARGV[e + 2]) end
      if mine then mine[#mine + 1] = id .. ' ' .. #ARGV[e + 2] .. ' ' .. ARGV[e + 2] end
    end
    if ttls ~= '0' then redis.call('EXPIRE', log, ARGV[2]) end
    if state_too then redis.call('HSET', state, 'sent', sent, 'seq', next_seq, 'at', at_ms) end
    if ttls == '1' then redis.call('EXPIRE', state, ARGV[3]) end
    if release then redis.call('DEL', KEYS[5 * j + 1]) end
    written[#written + 1] = 1
  end
  at = at + 3 * n
end
for _, pod in ipairs(pods) do
  redis.call('PUBLISH', pod, 'B' .. table.concat(frames[pod]))
end
return written
"""


@dataclass(frozen=True)
class FencedJob:
    """One job's part of a fenced write."""

    job_id: str
    events: list[tuple[EventEnvelope, bytes, bytes]]
    """(envelope, data, announcement), in order."""
    sent: int
    keep_from: int | None
    """The log loses its events before that seq (worker/wires/event_log_budget.py); None: it
    is cut to about EVENT_LOG_MAXLEN."""
    ttls: bool
    """Set the log's and the state's expiry (worker/wires/publisher.py TTL_REFRESH_S)."""
    state: bool
    """Write the job state's `sent`, `seq` and `at` (issue 44: not with every flush, one
    command a token). A reader needs of them only what the log cannot say cheaply: whether
    the job sent output (`sent` > 0: it is written when that turns true), and `seq` while
    `sent` is 0 (only "started" events, each its run's first write, which writes the state);
    the next seq is the log's last entry (scheduler/leases.py `Leases.start`) and `at` its
    `a` (scheduler/migration.py)."""
    reply_to: str = ""
    """The channel of the api pod that waits for the job (scheduler/hub.py EventHub.channel):
    its announcements go there, one message a flush for all its jobs (issue 44: a PUBLISH an
    event was one command a token); "": the job's own channel."""
    state_ttl: bool = True
    """With `ttls`, the state's too: not with a run's first flush, whose lease start set it a
    moment ago (scheduler/leases.py `Leases.start`; issue 44: a command a job)."""
    release: bool = False
    """Its lease goes after its events (their last: scheduler/leases.py `let_go`), in the
    same script, only while it is this worker's (as scheduler/lua_leases.py RELEASE)."""


def add_fenced(pipe: Pipeline, worker_id: str, jobs: list[FencedJob], at_ms: int) -> None:
    """Queue on `pipe` the write of several jobs' events in one script (one EVAL a flush, not
    one a job: issue 44), each job's done only while `worker_id` holds its lease: the
    pipeline's answer is a list, per job of `jobs`, of 1, or 0 when its lease is gone. EVAL,
    not EVALSHA: a script in a pipeline would cost redis-py a SCRIPT EXISTS round trip."""
    names: list[str] = []
    args: list[str | bytes | int] = [worker_id, keys.EVENT_LOG_TTL_S, keys.JOB_STATE_TTL_S,
                                     keys.EVENT_LOG_MAXLEN]
    for job in jobs:
        names += [keys.job_owner(job.job_id), keys.job_event_log(job.job_id),
                  keys.job_state(job.job_id), keys.job_events(job.job_id),
                  event_keys.job_watched(job.job_id)]
        args += [len(job.events), job.sent, job.events[-1][0].seq + 1, at_ms,
                 "" if job.keep_from is None else f"0-{job.keep_from + 1}",
                 ("1" if job.state_ttl else "2") if job.ttls else "0",
                 "1" if job.state else "0", job.reply_to,
                 job.job_id, "1" if job.release else "0"]
        for envelope, data, announced in job.events:
            args += [f"0-{envelope.seq + 1}", data, announced]
    pipe.eval(FENCED_WRITE, len(names), *names,
              *cast(list[str], args))  # redis-py takes bytes and ints as well
