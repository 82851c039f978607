"""Simulated workers (`llamaq worker --simulate`, ours): real worker processes' parts — arq
queues, leases, heartbeats, the registry, draining, the publisher, result offload, slot
actions — around the simulated engine (worker/simulate/), no model loaded; `--sim-workers N`
runs N of them on one event loop, each with its own Redis client (its name in CLIENT LIST is
its presence, scheduler/worker_presence.py) and its own id.

Owns: building the simulated workers and running them together. Hands off: the worker
(worker/process/serve.py WorkerRuntime), the engine (worker/simulate/engine.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from scheduler.connections import open_arq, open_redis
from scheduler.contract.errors import NotSupported
from worker.engine.loop import Engine
from worker.process.lease_keeper import LeaseKeeper
from worker.process.loop_health import LoopHealth
from worker.process.serve import WorkerRuntime
from worker.process.startup import embedding_mode, engine_defaults
from worker.runtime.model import LoadedModel
from worker.runtime.settings import WorkerSettings
from worker.simulate.engine import SimEngine
from worker.simulate.kv import BlockCache
from worker.simulate.model import SimModel
from worker.simulate.timing import TimingModel
from worker.simulate.vocab import SimVocab
from worker.wires.publisher import EventPublisher

log = logging.getLogger(__name__)


def timing_of(settings: WorkerSettings) -> TimingModel:
    return TimingModel(prefill_tps=settings.sim_prefill_tps, itl_ms=settings.sim_itl_ms,
                       itl_jitter=settings.sim_itl_jitter,
                       batch_slowdown=settings.sim_batch_slowdown,
                       batched=settings.sim_step == "batched")


def sim_engine(settings: WorkerSettings, model: LoadedModel, model_id: str, worker_id: str,
               publisher: EventPublisher) -> Engine:
    """The simulated engine of one worker (WorkerRuntime's `make_engine`)."""
    assert isinstance(model, SimModel)
    return SimEngine(model, engine_defaults(settings, model_id, worker_id), publisher.publish,
                     timing_of(settings), BlockCache(settings.sim_kv_tokens, settings.sim_kv_block),
                     settings.sim_eos_tokens)


def check_simulated(settings: WorkerSettings) -> None:
    """What a simulated worker does not simulate stops it at start, by name."""
    refused = [name for name, on in (
        ("--embedding/--rerank", embedding_mode(settings)), ("--decisions", settings.decisions),
        ("--lora", bool(settings.lora or settings.lora_scaled)),
        ("--mmproj", bool(settings.mmproj)), ("--spec-type", bool(settings.spec_type)),
        ("-lcd", bool(settings.lookup_cache_dynamic))) if on]
    if refused:
        raise NotSupported(f"--simulate does not simulate {', '.join(refused)}")


def worker_ids(settings: WorkerSettings) -> list[str]:
    n = settings.sim_workers
    if settings.worker_id:
        return [settings.worker_id] if n == 1 else \
            [f"{settings.worker_id}-{i}" for i in range(n)]
    return [f"sim-{uuid.uuid4().hex[:10]}" for _ in range(n)]


async def serve_simulated(settings: WorkerSettings, redis_url: str,
                          stop: asyncio.Event | None = None) -> None:
    """`--sim-workers` simulated workers until cancelled or `stop` (then each drains)."""
    check_simulated(settings)
    settings = settings.model_copy(update={"sleep_idle_seconds": -1, "kv_store": False})
    vocab = SimVocab()
    pool = await open_arq(redis_url)
    clients = []
    try:
        health = LoopHealth(settings.admit_lag_ms / 1000)
        async with LeaseKeeper(redis_url, health) as keeper:  # one thread for them all
            runs = []
            for worker_id in worker_ids(settings):
                mine = settings.model_copy(update={"worker_id": worker_id})
                redis = open_redis(redis_url)
                clients.append(redis)
                runtime = WorkerRuntime(mine, redis, SimModel(mine, vocab), None, keeper,
                                        make_engine=sim_engine)
                runs.append(runtime.run(pool, stop))
            log.info("%d simulated workers serve %s", len(runs), settings.model_id())
            await asyncio.gather(*runs)
    finally:
        for redis in clients:
            await redis.aclose()
        await pool.aclose()
