"""Fleet.has_workers, asked for every job (the cold-start hold), against a real Redis: a young
cached list that has a live worker answers without a registry read (one round trip less a
job); an empty one never does, so a model's first worker is seen at once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from api.fleet import WORKERS_CACHE_S, Fleet
from scheduler.client import JobClient
from scheduler.connections import open_arq
from scheduler.contract.results import GenerationSettings
from scheduler.hub import EventHub
from scheduler.registry import ModelMeta, Registry, WorkerInfo


class CountingRegistry(Registry):
    """The real registry, counting its reads of a model's live workers."""

    reads = 0

    async def live_workers(self, model_id: str) -> list[WorkerInfo]:
        self.reads += 1
        return await super().live_workers(model_id)


def info(worker_id: str, model_id: str) -> WorkerInfo:
    meta = ModelMeta(vocab_type=1, n_vocab=10, n_ctx_train=10, n_embd=1, n_params=1, size=1)
    return WorkerInfo(worker_id=worker_id, model_id=model_id, model_path="m", n_slots=1,
                      n_ctx_slot=10, meta=meta,
                      default_settings=GenerationSettings(
                          n_predict=-1, stop=[], max_tokens=-1, n_keep=0, stream=False,
                          timings_per_token=False, n_ctx=10, model="m"),
                      started_at=time.time())


@pytest.fixture
async def fleet(redis_url: str) -> AsyncIterator[tuple[Fleet, CountingRegistry]]:
    redis = Redis.from_url(redis_url)
    arq = await open_arq(redis_url)
    hub = EventHub(redis)
    registry = CountingRegistry(redis)
    yield Fleet(redis, arq, hub, JobClient(redis, arq, hub, 5.0), registry), registry
    await arq.aclose()
    await redis.aclose()


async def test_a_young_cached_live_worker_answers_without_a_registry_read(
        fleet: tuple[Fleet, CountingRegistry]) -> None:
    pod, registry = fleet
    worker = info("hw-live", "has-workers-live")
    await registry.heartbeat(worker)
    assert await pod.has_workers(worker.model_id)
    assert registry.reads == 1
    for _ in range(5):  # one job after another, inside the cache's moment
        assert await pod.has_workers(worker.model_id)
    assert registry.reads == 1
    pod._workers[worker.model_id] = (time.monotonic() - WORKERS_CACHE_S, [worker])
    assert await pod.has_workers(worker.model_id)  # an old list is read again
    assert registry.reads == 2


async def test_a_models_first_worker_is_seen_at_once(
        fleet: tuple[Fleet, CountingRegistry]) -> None:
    pod, registry = fleet
    worker = info("hw-first", "has-workers-first")
    assert not await pod.has_workers(worker.model_id)
    await registry.heartbeat(worker)  # while the pod's cached list is young and empty
    assert await pod.has_workers(worker.model_id)
    assert registry.reads == 2
