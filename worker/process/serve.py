"""A worker process: loads the model, runs the engine, takes jobs from arq, publishes events,
keeps its registry entry alive and listens for cancellations and wake-ups.

Owns: building the worker whole (`serve`: Redis, the model, then WorkerRuntime with its parts,
none of them optional) and taking it down; the arq workers of its queues; draining. Hands
off: the background loops (worker/process/loops.py), what a job function does around its body
(worker/process/jobrun.py), the job bodies (worker/jobs/), the model and the engine's defaults
from the settings (worker/process/startup.py), idle sleep (worker/process/sleep.py), the
engine (worker/engine/loop.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import cast

from arq.connections import ArqRedis
from arq.worker import Function
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from scheduler.connections import open_arq, open_redis
from scheduler.contract import keys
from scheduler.contract.errors import ServerError, Unavailable
from scheduler.contract.kinds import Lane, lane_queue
from scheduler.contract.results import ErrorEvent
from scheduler.decision_meta import DecisionCaps, output_modalities
from scheduler.leases import Leases, count_failure
from scheduler.llama_build import llama_build_info
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.registry import Registry, WorkerInfo
from scheduler.worker_presence import client_name
from storage import open_store
from storage.lazy import LazyStore
from storage.results import ResultStore
from worker.embed.embedder import Embedder
from worker.engine.loop import Engine
from worker.jobs.parts import HandBack, WorkerParts
from worker.kv.tier import KvTier, file_sha256, fingerprint
from worker.process.arq_worker import WakeableWorker
from worker.process.decision_parts import family_prompter, worker_decision_caps
from worker.process.jobrun import CTX_KEY, MAX_TRIES, JobRunner, functions
from worker.process.lease_keeper import LeaseKeeper
from worker.process.loop_health import LoopHealth
from worker.process.loops import RegistryEntry, Reporter, listen, on_lost_leases
from worker.process.lora_control import LoraControl
from worker.process.preempt import PreemptMode
from worker.process.preempt_call import PreemptCalls, channels, preemption
from worker.process.side_models import load_stages
from worker.process.sleep import Sleeper
from worker.process.startup import embedding_mode, fleet_media_marker, load_model, new_engine
from worker.runtime import flags
from worker.runtime.compute_threads import wait_policy_by_hand
from worker.runtime.model import LoadedModel, ModelLoadError
from worker.runtime.settings import WorkerSettings
from worker.speculative.lookup_share import LookupShare
from worker.wires.model_source import fetch_adapters, fetch_model
from worker.wires.publisher import EventPublisher
from worker.wires.result_offload import ResultOffload

log = logging.getLogger(__name__)

JOB_TIMEOUT_S = 7 * 24 * 3600
"""Generations are bounded by n_predict, the context and cancellation, not by arq's timer
(a dead worker's jobs are freed by their lease, not by this)."""
DRAIN_LAST_EVENTS_S = 5.0
"""After the drain timeout, how long the ended jobs' error events have to go out."""
ONLINE_EMBED_JOBS_PER_SEQ = 4
"""Online jobs an embedding worker holds per sequence of a decode: enough that a decode is
full while the next jobs are tokenized."""
BACKGROUND_EMBED_JOBS = 2
"""Background jobs (batch chunks) an embedding worker holds at once: one decoding, one being
prepared."""
UTILITY_JOBS = 8


async def serve(settings: WorkerSettings, redis_url: str, stop: asyncio.Event | None = None,
                on_load_progress: Callable[[list[str], str, float], None] | None = None
                ) -> None:
    """Build the worker whole (Redis, model, engine, publisher, leases), serve until cancelled
    or until `stop` is set (then drain), and take it all down again. `on_load_progress` is
    called from the loading thread with the load's stages, the current one and its progress,
    0..1 (router mode publishes them in /models/sse loading events)."""
    if settings.decisions and embedding_mode(settings):
        raise ModelLoadError("--decisions needs a worker that serves completions: it "
                             "cannot be combined with --embedding or --rerank")
    if (settings.lora or settings.lora_scaled) and embedding_mode(settings):
        raise ModelLoadError("--lora and --lora-scaled are not built for --embedding or "
                             "--rerank workers (adapters apply to completions)")
    flags.speculative(settings)  # a bad --spec-type stops the worker before it loads
    redis = open_redis(redis_url)
    try:
        pool = await open_arq(redis_url)
        try:
            source = await fetch_model(settings, redis)
            model_path = source.model
            if source.mmproj is not None:  # -hf's projector (--mmproj-auto)
                settings = settings.model_copy(update={"mmproj": str(source.mmproj)})
            if source.draft is not None:  # -hfd's draft model
                settings = settings.model_copy(update={"spec_draft_model": str(source.draft)})
            marker = await fleet_media_marker(redis, settings.model_id())  # /props: also
            # a text-only model's, as llama-server's
            caps = None if embedding_mode(settings) else worker_decision_caps(
                model_path, settings.decisions)
            adapter_files = await fetch_adapters(settings)
            progress = None if on_load_progress is None else functools.partial(
                on_load_progress, load_stages(settings))
            model = await asyncio.to_thread(load_model, settings, model_path, progress,
                                            adapter_files, marker, caps is not None)
            try:
                share = await lookup_share(settings, redis, model)
                health = LoopHealth(settings.admit_lag_ms / 1000)
                async with LeaseKeeper(redis_url, health) as keeper:
                    await WorkerRuntime(settings, redis, model, caps, keeper,
                                        share).run(pool, stop)
            finally:
                model.close()
        finally:
            await pool.aclose()
    finally:
        await redis.aclose()


async def lookup_share(settings: WorkerSettings, redis: Redis,
                       model: LoadedModel) -> LookupShare | None:
    """-lcd on a completion worker: the fleet's dynamic lookup cache of this model file,
    fetched to the -lcd file before the engine reads it."""
    if not settings.lookup_cache_dynamic or embedding_mode(settings):
        return None
    model_sha = await asyncio.to_thread(file_sha256, model.path, settings.model_cache_dir())
    share = LookupShare(settings.store_url, settings.s3_endpoint_url, redis, model_sha,
                        Path(settings.lookup_cache_dynamic))
    await share.fetch()
    return share


def kv_tier(settings: WorkerSettings, redis: Redis, parts: WorkerParts) -> KvTier | None:
    """--kv-store: the fleet-wide KV tier of this model (worker/kv/tier.py), fed by the
    engine's prefix states; off with control vectors (they change every state)."""
    if settings.control_vector or settings.control_vector_scaled:
        log.warning("kv tier off: control vectors change the KV states it would share")
        return None
    model, engine = parts.model, parts.engine
    model_sha = file_sha256(model.path, settings.model_cache_dir())
    tier = KvTier(redis, settings.store_url, settings.s3_endpoint_url, settings.model_id(),
                  fingerprint(model_sha, model.plan, model.n_ctx_slot), settings.kv_store_block,
                  settings.kv_store_min, settings.kv_store_max * 1024 * 1024,
                  lambda: parts.engine.speed.s_per_token)  # the engine of the moment
    loop = asyncio.get_running_loop()
    engine.on_tier_state = lambda tokens, data, salt: tier.save_from_thread(loop, tokens, data,
                                                                            salt)
    log.info("kv tier on: fingerprint %s, blocks of %d tokens from %d", tier.fingerprint,
             tier.block, tier.min_tokens)
    return tier


EngineMaker = Callable[[WorkerSettings, LoadedModel, str, str, EventPublisher], Engine]
"""Builds a worker's engine: new_engine (worker/process/startup.py), or the simulator's
(worker/process/simulated.py)."""


class WorkerRuntime:
    """A worker's parts (worker/jobs/parts.py), built together, and the process around them:
    the arq workers of its queues, the background loops, draining."""

    def __init__(self, settings: WorkerSettings, redis: Redis, model: LoadedModel,
                 caps: DecisionCaps | None, keeper: LeaseKeeper,
                 lookup: LookupShare | None = None,
                 make_engine: EngineMaker = new_engine) -> None:
        """Needs the running event loop (the publisher hands events over to it). `keeper`:
        the process's lease renewal and loop lag; `lookup`: the -lcd cache shared through the
        store; `make_engine`: the engine (the simulator's under --simulate)."""
        self.settings = settings
        self.keeper = keeper
        self.lookup = lookup
        model_id = settings.model_id()
        worker_id = settings.worker_id or f"{uuid.uuid4().hex[:12]}"
        # every connection opened from here on (the listener's, which stays open) carries the
        # worker's name: api pods see its death in CLIENT LIST (scheduler/worker_presence.py)
        redis.connection_pool.connection_kwargs["client_name"] = client_name(
            worker_id)
        leases = Leases(redis, worker_id)
        self.offload = ResultOffload(redis, ResultStore(LazyStore(
            lambda: open_store(settings.store_url, settings.s3_endpoint_url))))
        publisher = EventPublisher(redis, self._write_metrics, self._lost, leases, self.offload)
        publisher.interval_s = settings.stream_interval / 1000
        embedding = embedding_mode(settings)
        self.parts = WorkerParts(
            settings=settings, model_id=model_id, worker_id=worker_id, redis=redis,
            leases=leases, publisher=publisher, model=model,
            engine=make_engine(settings, model, model_id, worker_id, publisher),
            embedder=Embedder(model, not wait_policy_by_hand(os.environ)) if embedding else None,
            decision_caps=None if embedding else caps,
            decision_prompter=None if embedding else family_prompter(caps, model))
        if settings.kv_store and not embedding:
            self.parts.kv_tier = kv_tier(settings, redis, self.parts)
        if self.parts.decision_caps is not None and model.adapters.adapters:
            raise ModelLoadError("--lora is not built for a worker that serves decisions "
                                 "(--decisions or a decision model)")
        self.reporter = Reporter(self.parts)
        self._arq_workers: list[WakeableWorker] = []
        self._preempt_calls: PreemptCalls | None = None

    async def run(self, pool: ArqRedis, stop: asyncio.Event | None = None) -> None:
        """Serve until cancelled, or until `stop` is set: then drain (finish running jobs up
        to the drain timeout, hand the others back) and leave."""
        parts = self.parts
        model = parts.model
        parts.engine.start()
        if parts.embedder is not None:
            parts.embedder.start()
        entry = RegistryEntry(WorkerInfo(
            worker_id=parts.worker_id, model_id=parts.model_id, model_path=str(model.path),
            n_slots=model.plan.n_slots, n_ctx_slot=model.n_ctx_slot,
            meta=model.meta().model_copy(update={
                "decisions": parts.decision_caps,
                "output_modalities": output_modalities(parts.decision_caps)}),
            default_settings=parts.engine.default_settings(), started_at=time.time(),
            embedding=parts.embedder is not None,
            pooling=parts.embedder.pooling if parts.embedder else None,
            build_info=llama_build_info(), fit=model.fitted,
            draft_model=None if model.draft is None else str(model.draft.path),
            simulated=self.settings.simulate))
        registry = Registry(parts.redis)
        lora = LoraControl(parts, registry, entry)
        await lora.take_stored()
        sleeper = Sleeper(parts, registry, entry, self.settings.sleep_idle_seconds)
        runner = JobRunner(parts, sleeper)
        self._arq_workers = self._queues(pool, runner)
        calls = self._preempt_calls = self._preempt(runner)
        self.keeper.keep(parts.leases, on_lost_leases(parts))
        tasks = [
            asyncio.create_task(parts.publisher.run()),
            asyncio.create_task(listen(parts, *self._arq_workers, on_lora=lora.notice,
                                       more=channels(calls))),
            asyncio.create_task(self.offload.sweep_forever()),
            asyncio.create_task(self.reporter.run(registry, entry)),
            *(asyncio.create_task(w.main()) for w in self._arq_workers),
        ]
        if calls is not None:
            self.reporter.on_change.append(calls.changed)
            tasks.append(asyncio.create_task(calls.run()))
        if self.settings.sleep_idle_seconds >= 0:
            tasks.append(asyncio.create_task(sleeper.run()))
        if self.lookup is not None:
            tasks.append(asyncio.create_task(self.lookup.run(
                lambda: self.parts.engine.lookup_cache())))
        log.info("worker %s serves %s with %d slots", parts.worker_id, parts.model_id,
                 model.plan.n_slots)
        stopped = asyncio.create_task((stop or asyncio.Event()).wait())
        try:
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                task.result()  # a background task that ended takes the worker down with it
                raise ServerError(f"worker task {task.get_coro()!r} ended")
            await self._drain()
            if self.lookup is not None and (cache := parts.engine.lookup_cache()) is not None:
                await self.lookup.save(cache)  # what the last requests taught it
        finally:
            stopped.cancel()
            with contextlib.suppress(Exception):
                await registry.remove(entry.info)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.keeper.forget(parts.leases)
            if self.lookup is not None:
                self.lookup.close()
            log.info("worker %s: tasks stopped", parts.worker_id)
            parts.engine.stop()
            if parts.embedder is not None:
                parts.embedder.stop()
            if parts.model is not model:  # loaded again after an idle sleep: ours to close
                parts.model.close()
            log.info("worker %s: stopped", parts.worker_id)

    def _queues(self, pool: ArqRedis, runner: JobRunner) -> list[WakeableWorker]:
        """An arq worker per queue this worker takes jobs from, each running the functions
        the kind table puts in its lane."""
        parts = self.parts
        model = parts.model
        if parts.embedder is not None:
            n_online = max(1, parts.embedder.n_seq_max) * ONLINE_EMBED_JOBS_PER_SEQ
            workers = [self._arq_worker(pool, runner, Lane.EMBED, n_online),
                       self._arq_worker(pool, runner, Lane.EMBED_BACKGROUND,
                                        BACKGROUND_EMBED_JOBS)]
        else:
            n_slots = model.plan.n_slots
            workers = [self._arq_worker(pool, runner, Lane.SLOT, n_slots),
                       self._arq_worker(pool, runner, Lane.WORKER, n_slots)]
            workers.append(self._batch_worker(pool, runner, workers, n_slots))
        workers.append(self._arq_worker(pool, runner, Lane.UTILITY, UTILITY_JOBS))
        return workers

    def _preempt(self, runner: JobRunner) -> PreemptCalls | None:
        """--preempt: when this worker looks for a more urgent job (worker/process/
        preempt_call.py)."""
        slot = lane_queue(Lane.SLOT, self.parts.model_id)
        online = [w for w in self._arq_workers
                  if w.queue_name in (slot, lane_queue(Lane.WORKER, self.parts.model_id,
                                                       self.parts.worker_id))]
        return preemption(cast(PreemptMode, self.settings.preempt), self.parts, runner, online,
                          slot, self.settings.poll_delay)

    def _batch_worker(self, pool: ArqRedis, runner: JobRunner, online: list[WakeableWorker],
                      n_slots: int) -> WakeableWorker:
        """Batch lines (keys.batch_queue) start only in slots that online jobs leave free,
        keeping `reserve` slots for the next online request (online traffic keeps priority:
        a worker takes online jobs first, and a batch never fills the last slots)."""
        batch = self._arq_worker(pool, runner, Lane.BATCH, n_slots)
        reserve = min(self.settings.batch_reserve, n_slots - 1)

        def room() -> int:
            busy = sum(w.job_counter for w in online) + batch.job_counter
            return n_slots - reserve - busy

        batch.room = room
        for worker in online:
            worker.also_wake.append(batch)
        return batch

    def _arq_worker(self, pool: ArqRedis, runner: JobRunner, lane: Lane,
                    max_jobs: int) -> WakeableWorker:
        queue = lane_queue(lane, self.parts.model_id, self.parts.worker_id)
        lane_functions: list[Function] = functions(lane)
        worker = WakeableWorker(
            lane_functions, queue_name=queue, redis_pool=pool, max_jobs=max_jobs,
            job_timeout=JOB_TIMEOUT_S, max_tries=MAX_TRIES, keep_result=0,
            poll_delay=self.settings.poll_delay,
            handle_signals=False, ctx={CTX_KEY: runner}, job_serializer=serialize_job,
            job_deserializer=deserialize_job, log_results=False,
        )
        worker.model_id = self.parts.model_id
        worker.wake_me = keys.worker_wake_channel(queue, self.parts.worker_id)
        worker.idle_poll_delay_s = self.settings.idle_poll_delay
        worker.lease_gone = self.parts.leases.forget_gone
        worker.claims = self.parts.leases.claimed
        worker.admission = self.keeper.health.room
        return worker

    def _write_metrics(self, pipe: Pipeline) -> None:
        """Ahead of the events that start or end jobs (worker/wires/publisher.py)."""
        self.reporter.write_metrics(pipe)

    def _lost(self, job_id: str) -> None:
        """A job whose events Redis would not take: stop generating for nobody."""
        self.parts.engine.cancel(job_id)

    async def _drain(self) -> None:
        """Stop taking jobs; hand back those not started; let running generations finish up
        to the drain timeout; end the rest with an error event."""
        parts = self.parts
        parts.draining = True
        timeout = self.settings.drain_timeout
        log.info("worker %s: draining (running jobs have up to %g s)", parts.worker_id, timeout)
        for worker in self._arq_workers:
            worker.taking = False
            worker.wake.set()
        if self._preempt_calls is not None:
            await self._preempt_calls.leave()
        for request in parts.engine.withdraw_waiting():
            if request.job.worker_id:  # pinned here: no other worker can take it
                error = Unavailable("the worker this request was sent to is stopping")
                parts.publisher.publish([(request.job.job_id,
                                          ErrorEvent(error=error.to_info()))])
            else:
                parts.publisher.abandon(request.job.job_id, HandBack())
        deadline = time.monotonic() + timeout
        while self._running_job_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        left = self._running_job_ids()
        if not left:
            log.info("worker %s: drained", parts.worker_id)
            return
        log.warning("worker %s: drain timeout: ending %d jobs: %s", parts.worker_id, len(left),
                    ", ".join(left))
        error = Unavailable("the worker stopped before this request finished (drain timeout)")
        for job_id in left:
            parts.engine.cancel(job_id, error)
            if parts.embedder is not None:
                parts.embedder.cancel(job_id, error)
        await asyncio.gather(*(count_failure(parts.redis, parts.model_id, "drain_timeout")
                               for _ in left), return_exceptions=True)
        deadline = time.monotonic() + DRAIN_LAST_EVENTS_S
        while self._running_job_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _running_job_ids(self) -> list[str]:
        return [j for w in self._arq_workers for j in w.running_job_ids()]
