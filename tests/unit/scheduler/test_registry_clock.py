"""Liveness is judged by Redis's clock: a reader (api pod) whose clock runs 9 s ahead, or a
worker whose clock runs 9 s behind, still sees the live worker; a worker that stopped
beating is gone after the heartbeat TTL all the same."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.results import GenerationSettings
from scheduler.redis_clock import recent
from scheduler.registry import ModelMeta, Registry, WorkerInfo

REAL_TIME = time.time


def info(worker_id: str) -> WorkerInfo:
    meta = ModelMeta(vocab_type=1, n_vocab=10, n_ctx_train=10, n_embd=1, n_params=1, size=1)
    return WorkerInfo(worker_id=worker_id, model_id=f"clock-{worker_id}", model_path="m",
                      n_slots=1, n_ctx_slot=10, meta=meta,
                      default_settings=GenerationSettings(
                          n_predict=-1, stop=[], max_tokens=-1, n_keep=0, stream=False,
                          timings_per_token=False, n_ctx=10, model="m"),
                      started_at=REAL_TIME())


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.mark.parametrize("writer_s, reader_s", [(0, 9), (-9, 0), (9, -9)])
async def test_a_live_worker_is_live_whatever_the_machines_clocks_say(
        redis: Redis, monkeypatch: pytest.MonkeyPatch, writer_s: float, reader_s: float) -> None:
    worker = info(f"w{writer_s}{reader_s}")
    registry = Registry(redis)
    monkeypatch.setattr(time, "time", lambda: REAL_TIME() + writer_s)  # the worker's clock
    await registry.heartbeat(worker)
    monkeypatch.setattr(time, "time", lambda: REAL_TIME() + reader_s)  # the pod's clock
    assert [w.worker_id for w in await registry.live_workers(worker.model_id)] == \
        [worker.worker_id]


async def test_a_worker_that_stopped_beating_is_gone_after_the_ttl(redis: Redis) -> None:
    key = keys.model_workers("clock-stale")
    await redis.delete(key)
    now = float((await redis.time())[0])
    await redis.zadd(key, {"old": now - keys.HEARTBEAT_TTL_S - 1, "new": now})
    assert await recent(redis, key, keys.HEARTBEAT_TTL_S) == ["new"]
    assert await redis.zrange(key, 0, -1) == [b"new"]
