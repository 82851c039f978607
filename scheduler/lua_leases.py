"""A Lua helper of the queue's scripts: the leases (arq's in-progress keys) of a page of jobs in
one command (issue 44: an EXISTS a job, running ones included, was most of a job's commands).

Owns: that helper. Does not own: the scripts that use it (scheduler/leases.py CLAIM_JOBS and
WAITING_JOBS, scheduler/client.py ENQUEUE)."""

from __future__ import annotations

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
