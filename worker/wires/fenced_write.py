"""A leased job's events go to Redis only while this worker holds the job's lease.

A worker starved of CPU (not dead) can miss its lease renewals: the lease lapses, another
worker takes the job and continues it from the job's event log, and the starved worker, once it
runs again, would write on: two runs numbering events in one sequence, each seq taken by
whichever run came first, so a client reading in seq order could skip a token (one run's seq s
is the other's s + 1). The check and the writes are one Lua script per job and batch (atomic):
the events of a run whose lease is gone are never logged nor announced, and the continuing
worker, which takes the lease before it reads the log, reads every event the old run wrote.

Owns: the lease-fenced write of one job's events (log, announcement, job state). Does not own:
the numbering and retries (worker/wires/publisher.py), the leases (scheduler/leases.py)."""

from __future__ import annotations

from typing import cast

from redis.asyncio.client import Pipeline

from scheduler.contract import keys
from scheduler.contract.results import EventEnvelope

FENCED_WRITE = """
-- KEYS: the job's owner key, event log, state, pub/sub channel.
-- ARGV: worker id, log ttl (s), state ttl (s), sent, next seq, at (ms), log maxlen,
-- the last event's MINID ('' = trim to maxlen), then per event: entry id, data, announcement.
-- Returns 0 (nothing written) when the lease is not this worker's, else 1.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local n = (#ARGV - 8) / 3
for i = 0, n - 1 do
  local at = 9 + 3 * i
  local added
  if i == n - 1 and ARGV[8] ~= '' then
    added = redis.pcall('XADD', KEYS[2], 'MINID', ARGV[8], ARGV[at], 'e', ARGV[at + 1])
  else
    added = redis.pcall('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], ARGV[at], 'e', ARGV[at + 1])
  end
  -- a retry of a batch whose answer was lost finds its entries in: not an error
  if type(added) == 'table' and added.err and not string.find(added.err, 'equal or smaller') then
    return added
  end
  redis.call('PUBLISH', KEYS[4], ARGV[at + 2])
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], 'sent', ARGV[4], 'seq', ARGV[5], 'at', ARGV[6])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""


def add_fenced(pipe: Pipeline, worker_id: str, job_id: str,
               events: list[tuple[EventEnvelope, bytes, bytes]], sent: int, at_ms: int,
               keep_from: int | None) -> None:
    """Queue on `pipe` the write of one job's events (`(envelope, data, announcement)`, in
    order), done only while `worker_id` holds the job's lease: the pipeline's answer for it is
    1, or 0 when the lease is gone. `keep_from`: the log loses its events before that seq
    (worker/wires/event_log_budget.py); else it is cut to about EVENT_LOG_MAXLEN. EVAL, not
    EVALSHA: a script in a pipeline would cost redis-py a SCRIPT EXISTS round trip."""
    args: list[str | bytes | int] = [
        worker_id, keys.EVENT_LOG_TTL_S, keys.JOB_STATE_TTL_S, sent, events[-1][0].seq + 1,
        at_ms, keys.EVENT_LOG_MAXLEN, "" if keep_from is None else f"0-{keep_from + 1}"]
    for envelope, data, announced in events:
        args += [f"0-{envelope.seq + 1}", data, announced]
    pipe.eval(FENCED_WRITE, 4, keys.job_owner(job_id), keys.job_event_log(job_id),
              keys.job_state(job_id), keys.job_events(job_id),
              *cast(list[str], args))  # redis-py takes bytes and ints as well
