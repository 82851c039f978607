"""The Lua of the leases: a helper of the queue's scripts, the leases (arq's in-progress keys)
of a page of jobs in one command (issue 44: an EXISTS a job, running ones included, was most of
a job's commands), and a worker's renewal and release of its leases.

Owns: that helper, RENEW and RELEASE. Does not own: the scripts that use the helper
(scheduler/leases.py CLAIM_JOBS and WAITING_JOBS, scheduler/enqueue.py ENQUEUE), when leases are
renewed or released (scheduler/leases.py Leases)."""

from __future__ import annotations

from arq.constants import in_progress_key_prefix

from scheduler.contract import keys

LEASES_OF = """
-- leases_of(prefix, list, step): the values of prefix .. list[1], prefix .. list[1 + step],
-- ... in one MGET (false where no lease is held), in that order.
local function leases_of(prefix, list, step)
  local names = {}
  for i = 1, #list, step do names[#names + 1] = prefix .. list[i] end
  if #names == 0 then return {} end
  return redis.call('MGET', unpack(names))
end
"""

RENEW = """
-- ARGV: worker id, lease (ms), how many claimed jobs follow, those job ids, then the ids of
-- the jobs this worker started. A claimed job (a poll set its in-progress key, its run has
-- not taken the lease yet) has its in-progress key renewed, no more: a loop that lags may
-- take seconds from a claim to the start of its run. Renews the leases this worker still
-- holds and returns the ids of the started jobs whose lease it lost (it lapsed, and maybe
-- another worker took the job). The owners of all the jobs in one MGET (issue 44: a GET a
-- job a renewal), by chunks that Lua's unpack takes.
local lost = {}
local started = 4 + tonumber(ARGV[3])
for i = 4, started - 1 do redis.call('PEXPIRE', 'IN_PROGRESS' .. ARGV[i], ARGV[2]) end
for first = started, #ARGV, 500 do
  local last, names = math.min(first + 499, #ARGV), {}
  for i = first, last do names[#names + 1] = 'OWNER_PREFIX' .. ARGV[i] .. 'OWNER_SUFFIX' end
  local owners = redis.call('MGET', unpack(names))
  for i = first, last do
    local id = ARGV[i]
    if owners[i - first + 1] == ARGV[1] then
      redis.call('PEXPIRE', names[i - first + 1], ARGV[2])
      redis.call('PEXPIRE', 'IN_PROGRESS' .. id, ARGV[2])
    else
      lost[#lost + 1] = id
    end
  end
end
return lost
"""


RELEASE = """
-- KEYS: the owner keys of jobs that ended; ARGV[1]: this worker's id. Deletes those this
-- worker still holds (a lease that lapsed may be another worker's by now).
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
  end
end
return 0
"""


def renew_script() -> str:
    prefix, suffix = keys.job_owner("\0").split("\0")
    return (RENEW.replace("OWNER_PREFIX", prefix).replace("OWNER_SUFFIX", suffix)
            .replace("IN_PROGRESS", in_progress_key_prefix))
