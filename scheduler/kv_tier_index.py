"""Where the fleet-wide KV tier's states are (worker/kv/tier.py): one Redis hash per model
fingerprint, prefix hash → tokens and bytes of the state stored under it, and its LRU order
(Redis TIME, so every machine's clock agrees). Looking up and adding are one round trip each;
adding evicts the least recently used states over the size cap in the same script and returns
them, for the caller to delete from the object store."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from scheduler.contract import keys

TOUCH = """
-- KEYS[1] blocks hash, KEYS[2] lru zset; ARGV: the prefix hashes of a prompt, in order.
-- Returns {index, value} of the longest one stored (index from 1), and marks it used; {} if none.
local found = redis.call('HMGET', KEYS[1], unpack(ARGV))
for i = #ARGV, 1, -1 do
  if found[i] then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1000000, ARGV[i])
    return {i, found[i]}
  end
end
return {}
"""

ADD = """
-- KEYS[1] blocks hash, KEYS[2] lru zset; ARGV[1] prefix hash, ARGV[2] "n_tokens:bytes",
-- ARGV[3] the cap in bytes. Returns the prefix hashes evicted to stay under the cap.
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1000000, ARGV[1])
local total = 0
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  total = total + tonumber(string.match(value, ':(%d+)$'))
end
local evicted = {}
local cap = tonumber(ARGV[3])
while total > cap do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest or oldest == ARGV[1] then break end
  local value = redis.call('HGET', KEYS[1], oldest)
  if value then total = total - tonumber(string.match(value, ':(%d+)$')) end
  redis.call('HDEL', KEYS[1], oldest)
  redis.call('ZREM', KEYS[2], oldest)
  evicted[#evicted + 1] = oldest
end
return evicted
"""


@dataclass(frozen=True)
class StoredPrefix:
    index: int
    """Which of the looked-up prefix hashes (0-based): the longest one stored."""
    n_tokens: int
    n_bytes: int


class KvTierIndex:
    def __init__(self, redis: Redis, model_id: str, fingerprint: str) -> None:
        self._keys = [keys.kv_tier_blocks(model_id, fingerprint),
                      keys.kv_tier_lru(model_id, fingerprint)]
        self._touch = redis.register_script(TOUCH)
        self._add = redis.register_script(ADD)

    async def longest(self, prefix_hashes: list[str]) -> StoredPrefix | None:
        """The longest of `prefix_hashes` (in prompt order) that has a stored state."""
        if not prefix_hashes:
            return None
        found = await self._touch(keys=self._keys, args=prefix_hashes)
        if not found:
            return None
        value = found[1].decode() if isinstance(found[1], bytes) else str(found[1])
        n_tokens, _, n_bytes = value.partition(":")
        return StoredPrefix(int(found[0]) - 1, int(n_tokens), int(n_bytes))

    async def add(self, prefix_hash: str, n_tokens: int, n_bytes: int, cap_bytes: int) -> list[str]:
        """Record a stored state; returns the prefix hashes evicted over `cap_bytes`."""
        evicted = await self._add(keys=self._keys,
                                  args=[prefix_hash, f"{n_tokens}:{n_bytes}", cap_bytes])
        return [e.decode() if isinstance(e, bytes) else str(e) for e in evicted]
