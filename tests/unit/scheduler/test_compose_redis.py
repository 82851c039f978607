"""The compose Redis has a memory bound and evicts nothing (a job must never vanish); a write
past the bound (OOM) is a 503 with Retry-After, not a 500."""

from __future__ import annotations

import yaml
from redis.exceptions import ResponseError

from scheduler.contract.errors import RedisUnreachable
from scheduler.redis_errors import translate
from tests.paths import ROOT

REPO = ROOT


def test_compose_bounds_redis_memory_without_eviction() -> None:
    redis = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["redis"]
    command = " ".join(redis["command"])
    assert '--maxmemory "$$REDIS_MAXMEMORY"' in command
    assert "--maxmemory-policy noeviction" in command
    assert redis["environment"]["REDIS_MAXMEMORY"] == "${REDIS_MAXMEMORY:-2gb}"


def test_a_redis_out_of_memory_error_is_a_503_with_retry_after() -> None:
    ours = translate(ResponseError("OOM command not allowed when used memory > 'maxmemory'."))
    assert isinstance(ours, RedisUnreachable)
    assert ours.status == 503 and "out of memory" in str(ours)
    assert ours.retry_after_s == RedisUnreachable.RETRY_AFTER_S
