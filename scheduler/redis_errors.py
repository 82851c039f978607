"""Redis's errors as ours: Redis down, restarting, failing over or out of memory is
`RedisUnreachable` (503 with Retry-After), for the api and the worker alike.

The contract's `translate` knows no library (scheduler/contract/ imports pydantic alone); this
module teaches it Redis's errors when it is imported, and scheduler/connections.py, which opens
every Redis connection, imports it, so the translation is known before a Redis error can exist.
"""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from scheduler.contract.errors import LlamaqError, RedisUnreachable, translate_also


def redis_error_as_ours(error: BaseException) -> LlamaqError | None:
    """A Redis error as RedisUnreachable (an OOM reply says so in its message); None for an
    error that is not Redis's."""
    if isinstance(error, ResponseError) and str(error).startswith("OOM"):
        return RedisUnreachable("the job queue (Redis) is out of memory; retry later")
    if isinstance(error, RedisError):
        return RedisUnreachable()
    return None


translate_also(redis_error_as_ours)
