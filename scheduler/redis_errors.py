"""Every error as ours, Redis's included: Redis down, restarting, failing over or out of memory
is `RedisUnreachable` (503 with Retry-After), for the api and the worker alike.

The contract's `translate` knows no library (scheduler/contract/ imports pydantic alone); this
module's `translate` is the contract's plus Redis's errors, and is what the roles call.
"""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from scheduler.contract import errors
from scheduler.contract.errors import LlamaqError, RedisUnreachable


def translate(error: BaseException) -> LlamaqError | None:
    """Ours as the contract translates them, a Redis error as RedisUnreachable (an OOM reply
    says so in its message); None for anything else (a bug, which the caller reports as a
    500)."""
    if isinstance(error, ResponseError) and str(error).startswith("OOM"):
        return RedisUnreachable("the job queue (Redis) is out of memory; retry later")
    if isinstance(error, RedisError):
        return RedisUnreachable()
    return errors.translate(error)
