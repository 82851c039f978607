"""The tenants' fleet-wide limits (scheduler/tenant_limits.py) on a real Redis: buckets and
holds shared by every client, counted on Redis's clock (a pod whose clock is an hour off
changes nothing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from scheduler.contract import keys, tenant_keys
from scheduler.tenant_limits import TenantLimits

pytestmark = pytest.mark.process


@pytest_asyncio.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


def fresh(name: str) -> str:
    return f"{name}-{time.monotonic_ns()}"


async def test_requests_per_minute_are_shared_by_every_pod(redis: Redis,
                                                           redis_url: str) -> None:
    tenant = fresh("rpm")
    other_pod = Redis.from_url(redis_url)
    try:
        pods = [TenantLimits(redis), TenantLimits(other_pod)]
        results = await asyncio.gather(*(pods[i % 2].take_request(tenant, 5)
                                         for i in range(8)))
        refused = [r for r in results if r is not None]
        assert len(refused) == 3  # 5 of 8, whichever pod asked
        assert all(r.limit == "requests_per_minute" and 1 <= r.retry_after_s <= 12
                   for r in refused)
    finally:
        await other_pod.aclose()


async def test_max_concurrent_holds_places_until_released(redis: Redis) -> None:
    limits, tenant = TenantLimits(redis), fresh("conc")
    assert await limits.admit_job(tenant, "j1", 0, 2) is None
    assert await limits.admit_job(tenant, "j2", 0, 2) is None
    refusal = await limits.admit_job(tenant, "j3", 0, 2)
    assert refusal is not None and refusal.limit == "max_concurrent"
    assert await limits.active(tenant) == 2
    await limits.release(tenant, "j1")
    assert await limits.admit_job(tenant, "j3", 0, 2) is None


async def test_a_hold_not_renewed_lapses(redis: Redis) -> None:
    """A pod that died lets go: its hold's score is when it lapses (Redis TIME)."""
    limits, tenant = TenantLimits(redis), fresh("lapse")
    assert await limits.admit_job(tenant, "j1", 0, 1) is None
    await redis.zadd(tenant_keys.tenant_active(tenant), {"j1": 0})  # as if long unrenewed
    assert await limits.admit_job(tenant, "j2", 0, 1) is None
    await limits.renew(tenant, ["j2", "gone"])
    assert await limits.active(tenant) == 1  # renewing never adds a job


async def test_tokens_go_into_debt_and_the_debt_is_waited_out(redis: Redis) -> None:
    limits, tenant = TenantLimits(redis), fresh("tpm")
    assert await limits.admit_job(tenant, "j1", 600, 0) is None
    await limits.charge_tokens(tenant, 600, 660)  # a generation past the budget: not cut
    refusal = await limits.admit_job(tenant, "j2", 600, 0)
    assert refusal is not None and refusal.limit == "tokens_per_minute"
    assert 6 <= refusal.retry_after_s <= 8  # 60 tokens of debt + 1, at 10 tokens/s
    counts = await limits.counters()
    assert counts[tenant]["tokens"] == 660


async def test_the_pods_clock_does_not_count(redis: Redis,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Every time is Redis's: a pod an hour ahead refills nobody's bucket."""
    limits, tenant = TenantLimits(redis), fresh("clock")
    assert await limits.take_request(tenant, 1) is None
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert await limits.take_request(tenant, 1) is not None


async def test_a_jobs_tokens_are_charged_once_whoever_reads_them(redis: Redis,
                                                                 redis_url: str) -> None:
    """The request's pod and a resume's pod read the same job's events: each token is charged
    once (the job's charged count in Redis), to the bucket and to the counters."""
    tenant, job_id = fresh("once"), fresh("job")
    other_pod = Redis.from_url(redis_url)
    try:
        first, resumed = TenantLimits(redis), TenantLimits(other_pod)
        assert await first.charge_job(tenant, 600, job_id, 40) == 40
        assert await resumed.charge_job(tenant, 600, job_id, 30) == 0  # a replay, behind
        assert await resumed.charge_job(tenant, 600, job_id, 100) == 60
        assert await first.charge_job(tenant, 600, job_id, 100) == 0
        assert (await first.counters())[tenant]["tokens"] == 100
        level = float(await redis.hget(tenant_keys.tenant_tokens(tenant), "level") or 0)  # type: ignore[misc]
        assert 500 <= level < 502  # 600 - 100, refilled by a moment at 10 tokens/s
        assert 0 < await redis.ttl(tenant_keys.tenant_job_charged(job_id)) <= keys.EVENT_LOG_TTL_S
    finally:
        await other_pod.aclose()
