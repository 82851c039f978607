"""Tenants' limits, enforced fleet-wide in Redis: requests and tokens per minute (token
buckets) and jobs at once (holds), each checked and charged in one script on Redis's own clock
(`TIME`), so api pods on machines whose clocks differ agree and requests that arrive together
cannot pass one check together.

A bucket holds up to its per-minute limit and refills at limit/60 per second. A request takes
one from the requests bucket (none left: refused). The tokens bucket is checked when a job is
admitted (refused while it is empty or in debt) and charged as the tokens become known (the
prompt at admission, the output as it is generated): it may go below zero, a debt the tenant
pays by waiting, so a generation that started within the budget is never cut off and a
minute's budget is overrun by at most what the tenant's jobs admitted at once generate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from redis.asyncio import Redis

from scheduler.contract import keys, tenant_keys

_REFILL = """
local function refill(key, limit, now_ms)
  local rate = limit / 60000.0
  local state = redis.call('HMGET', key, 'level', 'at_ms')
  local level = tonumber(state[1])
  local at = tonumber(state[2])
  if level == nil or at == nil then return limit end
  return math.min(limit, level + math.max(0, now_ms - at) * rate)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function store(key, level, now_ms, limit)
  redis.call('HSET', key, 'level', tostring(level), 'at_ms', tostring(now_ms))
  -- full again after (limit - level) / rate: keep it at least that long
  local debt_ms = math.max(0, (limit - level) * 60000.0 / limit)
  redis.call('PEXPIRE', key, math.max(tonumber(ARGV[#ARGV]) * 1000, math.ceil(debt_ms)))
end
"""

TAKE_REQUEST = _REFILL + """
-- KEYS[1]: the tenant's requests bucket; ARGV: its limit per minute, the bucket's TTL (s).
-- Returns {1, 0} and takes one, or {0, ms until one is there}.
local limit = tonumber(ARGV[1])
local now = now_ms()
local level = refill(KEYS[1], limit, now)
if level < 1 then
  return {0, math.ceil((1 - level) * 60000.0 / limit)}
end
store(KEYS[1], level - 1, now, limit)
return {1, 0}
"""

ADMIT_JOB = _REFILL + """
-- KEYS[1]: the tenant's tokens bucket, KEYS[2]: its jobs' holds; ARGV: tokens per minute
-- (0: none), max concurrent (0: none), the job id, hold (ms), the bucket's TTL (s).
-- Checks both before taking anything. Returns {1, 0, ''}, or {0, ms to wait, which limit}.
local tpm = tonumber(ARGV[1])
local most = tonumber(ARGV[2])
local now = now_ms()
if tpm > 0 then
  local level = refill(KEYS[1], tpm, now)
  if level <= 0 then
    return {0, math.ceil((1 - level) * 60000.0 / tpm), 'tokens_per_minute'}
  end
end
if most > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZSCORE', KEYS[2], ARGV[3]) == false and
      redis.call('ZCARD', KEYS[2]) >= most then
    return {0, 1000, 'max_concurrent'}
  end
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
end
return {1, 0, ''}
"""

CHARGE_TOKENS = _REFILL + """
-- KEYS[1]: the tenant's tokens bucket; ARGV: tokens per minute, tokens used, TTL (s).
local limit = tonumber(ARGV[1])
local now = now_ms()
local level = refill(KEYS[1], limit, now) - tonumber(ARGV[2])
store(KEYS[1], level, now, limit)
return tostring(level)
"""

CHARGE_JOB = _REFILL + """
-- KEYS[1]: the tenant's tokens bucket, KEYS[2]: the job's charged count, KEYS[3]: the
-- counters; ARGV: tokens per minute (0: no bucket), the job's tokens seen, the counter's
-- field, the count's TTL (s), the bucket's TTL (s). Charges what is over the count, once.
local seen = tonumber(ARGV[2])
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
if seen <= before then return 0 end
redis.call('SET', KEYS[2], tostring(seen), 'EX', tonumber(ARGV[4]))
local due = seen - before
local limit = tonumber(ARGV[1])
if limit > 0 then
  local now = now_ms()
  store(KEYS[1], refill(KEYS[1], limit, now) - due, now, limit)
end
redis.call('HINCRBY', KEYS[3], ARGV[3], due)
return due
"""

RENEW_HOLDS = """
-- KEYS[1]: a tenant's jobs' holds; ARGV: hold (ms), then job ids. Renews those still held.
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])
end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1])) end
return 0
"""


RESERVE_UPLOAD = """
-- KEYS[1]: the tenant's uploads in flight; ARGV: the file id, its bytes, hold (ms). Drops
-- lapsed reservations, adds this one and returns the others ({file id, bytes, ...}).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local others = redis.call('ZRANGE', KEYS[1], 0, -1)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1] .. ':' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return others
"""


@dataclass(frozen=True)
class Refusal:
    """A limit a request is over, and how long until it is not."""

    limit: str
    retry_after_s: int


def _seconds(ms: int) -> int:
    return max(1, math.ceil(ms / 1000))


class TenantLimits:
    """The scripts above, and the per-tenant counters of /metrics
    (`tenant_keys.TENANT_COUNTERS`)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._take = redis.register_script(TAKE_REQUEST)
        self._admit = redis.register_script(ADMIT_JOB)
        self._charge = redis.register_script(CHARGE_TOKENS)
        self._charge_job = redis.register_script(CHARGE_JOB)
        self._renew = redis.register_script(RENEW_HOLDS)
        self._reserve_upload = redis.register_script(RESERVE_UPLOAD)

    async def take_request(self, tenant: str, per_minute: int) -> Refusal | None:
        ok, wait_ms = await self._take(keys=[tenant_keys.tenant_requests(tenant)],
                                       args=[per_minute, tenant_keys.TENANT_BUCKET_TTL_S])
        if int(ok):
            return None
        return Refusal("requests_per_minute", _seconds(int(wait_ms)))

    async def admit_job(self, tenant: str, job_id: str, tokens_per_minute: int,
                        max_concurrent: int) -> Refusal | None:
        ok, wait_ms, which = await self._admit(
            keys=[tenant_keys.tenant_tokens(tenant), tenant_keys.tenant_active(tenant)],
            args=[tokens_per_minute, max_concurrent, job_id, int(tenant_keys.TENANT_HOLD_S * 1000),
                  tenant_keys.TENANT_BUCKET_TTL_S])
        if int(ok):
            return None
        name = which.decode() if isinstance(which, bytes) else str(which)
        return Refusal(name, _seconds(int(wait_ms)))

    async def charge_tokens(self, tenant: str, tokens_per_minute: int, n_tokens: int) -> None:
        """Charge the tenant's bucket (when it has one) and count the tokens."""
        if n_tokens <= 0:
            return
        if tokens_per_minute > 0:
            await self._charge(keys=[tenant_keys.tenant_tokens(tenant)],
                               args=[tokens_per_minute, n_tokens, tenant_keys.TENANT_BUCKET_TTL_S])
        await self._redis.hincrby(tenant_keys.TENANT_COUNTERS, f"tokens:{tenant}", n_tokens)  # type: ignore[misc]

    async def charge_job(self, tenant: str, tokens_per_minute: int, job_id: str,
                         seen: int) -> int:
        """Charge a job's tokens up to `seen` (its prompt and output so far), those not
        charged yet by anyone; returns how many this call charged."""
        if seen <= 0:
            return 0
        due = await self._charge_job(
            keys=[tenant_keys.tenant_tokens(tenant), tenant_keys.tenant_job_charged(job_id),
                  tenant_keys.TENANT_COUNTERS],
            args=[tokens_per_minute, seen, f"tokens:{tenant}", keys.EVENT_LOG_TTL_S,
                  tenant_keys.TENANT_BUCKET_TTL_S])
        return int(due)

    async def reserve_upload(self, tenant: str, file_id: str, size: int) -> dict[str, int]:
        """Reserve `size` bytes for the upload of `file_id`; the uploads in flight before it
        (file id -> bytes): the caller counts those whose files it does not see stored yet
        (read after this call), so two uploads that arrive together never both pass."""
        others = await self._reserve_upload(
            keys=[tenant_keys.tenant_uploads(tenant)],
            args=[file_id, size, int(tenant_keys.TENANT_UPLOAD_HOLD_S * 1000)])
        found: dict[str, int] = {}
        for member in others:
            text = member.decode() if isinstance(member, bytes) else str(member)
            other_id, _, other_size = text.rpartition(":")
            found[other_id] = int(other_size)
        return found

    async def end_upload(self, tenant: str, file_id: str, size: int) -> None:
        await self._redis.zrem(tenant_keys.tenant_uploads(tenant), f"{file_id}:{size}")

    async def release(self, tenant: str, job_id: str) -> None:
        await self._redis.zrem(tenant_keys.tenant_active(tenant), job_id)

    async def renew(self, tenant: str, job_ids: list[str]) -> None:
        if job_ids:
            await self._renew(keys=[tenant_keys.tenant_active(tenant)],
                              args=[int(tenant_keys.TENANT_HOLD_S * 1000), *job_ids])

    async def count(self, tenant: str, what: str) -> None:
        """`requests` or `limited` (a 429)."""
        await self._redis.hincrby(tenant_keys.TENANT_COUNTERS, f"{what}:{tenant}", 1)  # type: ignore[misc]

    async def count_wait(self, tenant: str, priority: int, waited_s: float) -> None:
        """A job of the tenant started after `waited_s` in the queues (docs/fairness.md)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(tenant_keys.TENANT_COUNTERS, f"waited_ms:{tenant}:{priority}",
                         round(waited_s * 1000))
            pipe.hincrby(tenant_keys.TENANT_COUNTERS, f"started:{tenant}:{priority}", 1)
            await pipe.execute()

    async def counters(self) -> dict[str, dict[str, int]]:
        """tenant -> {tokens, requests, limited, and per priority `waited_ms@<priority>`,
        `started@<priority>`, `preempted@<priority>`}."""
        raw = await self._redis.hgetall(tenant_keys.TENANT_COUNTERS)  # type: ignore[misc]
        out: dict[str, dict[str, int]] = {}
        for field, value in raw.items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            what, _, tenant = name.partition(":")
            tenant, _, priority = tenant.partition(":")
            counts = out.setdefault(tenant, {"tokens": 0, "requests": 0, "limited": 0})
            counts[f"{what}@{priority}" if priority else what] = int(value)
        return out

    async def active(self, tenant: str) -> int:
        return int(await self._redis.zcard(tenant_keys.tenant_active(tenant)))


async def count_preempted(redis: Redis, tenant: str, priority: int) -> None:
    """A job of the tenant gave its slot up to a more urgent one (worker/process/preempt.py)."""
    await redis.hincrby(tenant_keys.TENANT_COUNTERS, f"preempted:{tenant}:{priority}", 1)  # type: ignore[misc]
