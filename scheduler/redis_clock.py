"""Liveness by Redis's clock, not the machine's: heartbeats are scored with Redis `TIME` and
read against it, inside scripts, so a pod or worker whose clock is off by seconds neither makes
live workers vanish nor keeps dead ones (every cross-machine time comparison goes through one
clock)."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

LUA_NOW_MS = """local _t = redis.call('TIME')
local now_ms = tonumber(_t[1]) * 1000 + math.floor(tonumber(_t[2]) / 1000)
local now_score = string.format('%.3f', tonumber(_t[1]) * 1000 + tonumber(_t[2]) / 1000)
"""
"""A script's first lines: `now_ms`, Redis's now in ms, and `now_score`, the same to the
microsecond as the string a queue's ZADD takes (queue scores are on Redis's clock: a job enqueued
by a pod whose clock is ahead is due at once, not when that clock says; the microseconds keep
two jobs enqueued in the same millisecond in arrival order instead of job-id order)."""

STAMP = """
local t = redis.call('TIME')
return redis.call('ZADD', KEYS[1], tonumber(t[1]) + tonumber(t[2]) / 1000000, ARGV[1])
"""
"""KEYS[1]: a sorted set of heartbeats; ARGV[1]: the member that beats now (Redis's now)."""

RECENT = """
local t = redis.call('TIME')
local cutoff = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
"""KEYS[1]: a sorted set of heartbeats; ARGV[1]: how old a beat may be (s). Drops the members
whose last beat is older and returns the others."""



def stamp(pipe: Pipeline, key: str, member: str) -> None:
    """Queue a heartbeat of `member` in `key` on `pipe`, at Redis's now."""
    pipe.eval(STAMP, 1, key, member)


async def recent(redis: Redis, key: str, max_age_s: float) -> list[str]:
    """The members of `key` that beat within `max_age_s` (by Redis's clock); the others go."""
    members = await redis.register_script(RECENT)(keys=[key], args=[max_age_s])
    return [m.decode() if isinstance(m, bytes) else str(m) for m in members]
