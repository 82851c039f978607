"""A worker process: loads the model, runs the engine, takes jobs from arq, publishes events,
keeps its registry entry alive and listens for cancellations and wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp as lc
from arq.connections import ArqRedis, create_pool
from llama_cpp.llama_grammar import json_schema_to_gbnf
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from scheduler import keys
from scheduler.affinity import PrefixIndex
from scheduler.connections import arq_settings, open_redis
from scheduler.decision_meta import DecisionCaps, output_modalities
from scheduler.errors import (
    InvalidRequest,
    LlamaqError,
    NotSupported,
    ServerError,
    Unavailable,
)
from scheduler.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    RerankJob,
    SamplingSettings,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.leases import Leases, count_failure
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.registry import Registry, WorkerInfo, write_slots
from scheduler.results import (
    DetokenizeResult,
    ErrorEvent,
    FinalEvent,
    SlotActionResult,
    TokenizeResult,
    TokenPiece,
)
from storage import (
    InvalidKey,
    ObjectNotFound,
    SlotSnapshotStore,
    StorageError,
    StorageUnavailable,
    check_slot_name,
    open_store,
)
from storage.redact import redact
from worker import flags
from worker.arq_worker import WakeableWorker
from worker.decision_plan import decision_caps, plan_decision
from worker.embed_jobs import (
    embed_functions,
    embed_queues,
    embedding_batch,
    embedding_mode,
    run_embed_job,
    tune_embedding_context,
)
from worker.embedder import Embedder
from worker.engine import Engine
from worker.jobrun import (
    MAX_TRIES,
    HandBack,
    completion_functions,
    slot_functions,
    utility_functions,
)
from worker.model import ContextPlan, LoadedModel, ModelLoadError, default_threads
from worker.model_source import fetch_model
from worker.publisher import EventPublisher
from worker.requests import EngineDefaults
from worker.sampling import DEFAULT_SEED, normalize_samplers
from worker.settings import WorkerSettings
from worker.sleep import Sleeper
from worker.snapshots import (
    SnapshotMeta,
    check_snapshot,
    erase_slot,
    restore_error,
    restore_slot,
    save_slot,
)

log = logging.getLogger(__name__)

JOB_TIMEOUT_S = 7 * 24 * 3600
"""Generations are bounded by n_predict, the context and cancellation, not by arq's timer
(a dead worker's jobs are freed by their lease, not by this)."""
SLOT_REPORT_MIN_GAP_S = 0.05
REDIS_RETRY_S = 1.0
DRAIN_LAST_EVENTS_S = 5.0
"""After the drain timeout, how long the ended jobs' error events have to go out."""


class WorkerRuntime:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.model_id = settings.model_id()
        self.worker_id = settings.worker_id or f"{uuid.uuid4().hex[:12]}"
        self.redis: Redis | None = None
        self.engine: Engine | None = None
        self.embedder: Embedder | None = None
        """Set on a worker started with --embedding or --rerank (worker/embed_jobs.py)."""
        self.publisher: EventPublisher | None = None
        self.leases: Leases | None = None
        self.draining = False
        self._arq_workers: list[WakeableWorker] = []
        self._prefixes = PrefixIndex()
        self.info: WorkerInfo | None = None
        """This worker's registry entry, as its heartbeats write it."""
        self.sleeper: Sleeper | None = None
        self._decision_caps: DecisionCaps | None = None
        self.on_load_progress: Callable[[float], None] | None = None
        """Called from the loading thread with the load's progress, 0..1 (router mode
        publishes it in /models/sse loading events)."""
        self._progress_callback: Any = None

    # -- start and stop -----------------------------------------------------------------

    async def run(self, redis_url: str, stop: asyncio.Event | None = None) -> None:
        """Serve until cancelled, or until `stop` is set: then drain (finish running jobs up
        to the drain timeout, hand the others back) and leave."""
        self.redis = open_redis(redis_url)
        pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                                 job_deserializer=deserialize_job)
        if self.settings.decisions and embedding_mode(self.settings):
            raise ModelLoadError("--decisions needs a worker that serves completions: it "
                                 "cannot be combined with --embedding or --rerank")
        if self.settings.sleep_idle_seconds >= 0 and embedding_mode(self.settings):
            raise ModelLoadError("--sleep-idle-seconds is not built for --embedding or "
                                 "--rerank workers (only completion workers sleep)")
        model_path = await fetch_model(self.settings, self.redis)
        model = await asyncio.to_thread(self._load_model, model_path)
        if not embedding_mode(self.settings):  # decisions run in the completion engine
            self._decision_caps = decision_caps(model.path, self.settings.decisions)
        self.publisher = EventPublisher(self.redis, self._write_metrics, self._lost)
        self.leases = Leases(self.redis, self.worker_id)
        self.engine = Engine(model, self._defaults(), self.publisher.from_thread)
        self.engine.start()
        if embedding_mode(self.settings):
            self.embedder = Embedder(model)
            self.embedder.start()
            self._arq_workers = [self._arq_worker(pool, queue, embed_functions(), n)
                                 for queue, n in embed_queues(self.model_id,
                                                              self.embedder.n_seq_max)]
        else:
            self._arq_workers = [
                self._arq_worker(pool, keys.slot_queue(self.model_id), slot_functions(),
                                 model.plan.n_slots),
                self._arq_worker(pool, keys.worker_queue(self.model_id, self.worker_id),
                                 completion_functions(), model.plan.n_slots),
            ]
            self._add_batch_worker(pool, slot_functions()[:1], model.plan.n_slots)
        self._arq_workers.append(self._arq_worker(pool, keys.utility_queue(self.model_id),
                                                  utility_functions(), max_jobs=8))
        self.info = info = WorkerInfo(
            worker_id=self.worker_id, model_id=self.model_id, model_path=str(model.path),
            n_slots=model.plan.n_slots, n_ctx_slot=model.n_ctx_slot,
            meta=model.meta().model_copy(update={
                "decisions": self._decision_caps,
                "output_modalities": output_modalities(self._decision_caps)}),
            default_settings=self.engine.default_settings(), started_at=time.time(),
            embedding=self.embedder is not None,
            pooling=self.embedder.pooling if self.embedder else None)
        registry = Registry(self.redis)
        self.sleeper = Sleeper(self, registry, self.settings.sleep_idle_seconds)
        tasks = [
            asyncio.create_task(self.publisher.run()),
            asyncio.create_task(self._listen(*self._arq_workers)),
            asyncio.create_task(self._renew_leases()),
            asyncio.create_task(self._report(registry, info)),
            *(asyncio.create_task(w.main()) for w in self._arq_workers),
        ]
        if self.settings.sleep_idle_seconds >= 0:
            tasks.append(asyncio.create_task(self.sleeper.run()))
        log.info("worker %s serves %s with %d slots", self.worker_id, self.model_id,
                 model.plan.n_slots)
        stopped = asyncio.create_task((stop or asyncio.Event()).wait())
        try:
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopped}:
                task.result()  # a background task that ended takes the worker down with it
                raise ServerError(f"worker task {task.get_coro()!r} ended")
            await self._drain()
        finally:
            stopped.cancel()
            with contextlib.suppress(Exception):
                await registry.remove(info)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            log.info("worker %s: tasks stopped", self.worker_id)
            self.engine.stop()
            if self.embedder is not None:
                self.embedder.stop()
            self.engine.model.close()  # the model loaded last (idle sleep reloads it)
            await pool.aclose()
            await self.redis.aclose()
            log.info("worker %s: stopped", self.worker_id)

    def reload_engine(self) -> None:
        """Load the model again and start a new engine on it (a worker waking from idle
        sleep); the worker's counters carry on."""
        old = self.engine
        assert old is not None and self.publisher is not None
        engine = Engine(self._load_model(old.model.path), self._defaults(),
                        self.publisher.from_thread)
        engine.metrics = old.metrics
        engine.on_slots_changed = old.on_slots_changed
        engine.start()
        self.engine = engine

    def _lost(self, job_id: str) -> None:
        """A job whose events Redis would not take: stop generating for nobody."""
        if self.engine is not None:
            self.engine.cancel(job_id)

    async def _drain(self) -> None:
        """Stop taking jobs; hand back those not started; let running generations finish up
        to the drain timeout; end the rest with an error event."""
        assert self.engine is not None and self.publisher is not None
        self.draining = True
        timeout = self.settings.drain_timeout
        log.info("worker %s: draining (running jobs have up to %g s)", self.worker_id, timeout)
        for worker in self._arq_workers:
            worker.taking = False
            worker.wake.set()
        for request in self.engine.withdraw_waiting():
            if request.job.worker_id:  # pinned here: no other worker can take it
                error = Unavailable("the worker this request was sent to is stopping")
                self.publisher.publish([(request.job.job_id, ErrorEvent(error=error.to_info()))])
            else:
                self.publisher.abandon(request.job.job_id, HandBack())
        deadline = time.monotonic() + timeout
        while self._running_job_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        left = self._running_job_ids()
        if not left:
            log.info("worker %s: drained", self.worker_id)
            return
        log.warning("worker %s: drain timeout: ending %d jobs: %s", self.worker_id, len(left),
                    ", ".join(left))
        error = Unavailable("the worker stopped before this request finished (drain timeout)")
        for job_id in left:
            self.engine.cancel(job_id, error)
            if self.embedder is not None:
                self.embedder.cancel(job_id, error)
        assert self.redis is not None
        await asyncio.gather(*(count_failure(self.redis, self.model_id, "drain_timeout")
                               for _ in left), return_exceptions=True)
        deadline = time.monotonic() + DRAIN_LAST_EVENTS_S
        while self._running_job_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _add_batch_worker(self, pool: ArqRedis, functions: list[Any], n_slots: int) -> None:
        """Batch lines (keys.batch_queue) start only in slots that online jobs leave free,
        keeping `reserve` slots for the next online request (online traffic keeps priority:
        a worker takes online jobs first, and a batch never fills the last slots)."""
        online = self._arq_workers[:2]
        batch = self._arq_worker(pool, keys.batch_queue(self.model_id), functions, n_slots)
        reserve = min(self.settings.batch_reserve, n_slots - 1)

        def room() -> int:
            busy = sum(w.job_counter for w in online) + batch.job_counter
            return n_slots - reserve - busy

        batch.room = room
        for worker in online:
            worker.also_wake.append(batch)
        self._arq_workers.append(batch)

    def _running_job_ids(self) -> list[str]:
        return [j for w in self._arq_workers for j in w.running_job_ids()]

    async def _renew_leases(self) -> None:
        """Keep the leases of running jobs; a job whose lease lapsed anyway (this loop was
        starved) may run elsewhere now: this worker stops it and sends nothing more for it."""
        assert self.leases is not None and self.engine is not None
        assert self.publisher is not None
        while True:
            try:
                lost = await self.leases.renew()
            except RedisError as error:  # Redis away: keep trying, the worker lives on
                log.warning("cannot renew leases (%s); retrying", error)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            for job_id in lost:
                log.error("job %s: lease lost (worker %s was too slow to renew it); "
                          "stopping it here", job_id, self.worker_id)
                self.publisher.abandon(job_id, Unavailable("lease lost"))
                self.engine.cancel(job_id)
            await asyncio.sleep(keys.LEASE_RENEW_EVERY_S)

    def _write_metrics(self, pipe: Pipeline) -> None:
        """Metrics and slot states, written ahead of the events that end jobs: a client that
        got its result sees its slot idle in /slots, as llama-server shows it."""
        assert self.engine is not None
        metrics = (self.embedder or self.engine).metrics_snapshot()
        pipe.set(keys.worker_metrics(self.worker_id), metrics.model_dump_json(),
                 ex=keys.HEARTBEAT_TTL_S)
        write_slots(pipe, self.worker_id, self.engine.slot_states())
        if self.embedder is None:  # cache-aware routing: only completion workers take part
            n_free = (len(self.engine.slots) - metrics.requests_processing
                      - metrics.requests_deferred)
            pipe.set(keys.worker_prefixes(self.worker_id),
                     self._prefixes.summary(self.engine.slot_jobs(), n_free).model_dump_json(),
                     ex=keys.HEARTBEAT_TTL_S)

    async def _report(self, registry: Registry, info: WorkerInfo) -> None:
        """Heartbeats, and the slots' state whenever a slot starts or ends a request."""
        assert self.engine is not None
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()

        def notify() -> None:
            loop.call_soon_threadsafe(changed.set)

        self.engine.on_slots_changed = notify
        next_heartbeat = 0.0
        while True:
            changed.clear()
            try:
                await registry.publish_slots(self.worker_id, self.engine.slot_states())
                async with self.redis.pipeline(transaction=False) as pipe:  # type: ignore[union-attr]
                    self._write_metrics(pipe)
                    await pipe.execute()
                if time.monotonic() >= next_heartbeat:
                    await registry.heartbeat(self.info or info)
                    next_heartbeat = time.monotonic() + keys.HEARTBEAT_EVERY_S
            except RedisError as error:  # Redis away: keep trying, the worker lives on
                log.warning("cannot report to Redis (%s); retrying", error)
                next_heartbeat = 0.0
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), next_heartbeat - time.monotonic())
            await asyncio.sleep(SLOT_REPORT_MIN_GAP_S)  # many changes at once: one report

    def _load_model(self, path: Path) -> LoadedModel:
        s = self.settings
        n_slots = 4 if s.n_parallel < 0 else s.n_parallel
        threads = default_threads() if s.threads < 1 else s.threads
        embedding = embedding_mode(s)
        plan = ContextPlan(
            n_ctx=s.ctx_size, n_slots=n_slots,
            kv_unified=s.kv_unified if s.kv_unified is not None else s.n_parallel < 0,
            n_batch=embedding_batch(s) if embedding else s.batch_size, n_ubatch=s.ubatch_size,
            n_threads=threads,
            n_threads_batch=s.threads_batch or threads,
            # Prefix reuse on sliding-window models (Gemma 3) needs the full-size SWA cache.
            swa_full=s.swa_full or s.cache_prompt,
            flash_attn=s.flash_attn, cache_type_k=s.cache_type_k, cache_type_v=s.cache_type_v,
            n_ctx_slot_cap=s.kv_unified_per_slot,
        )

        def tune_context(params: Any) -> None:
            flags.tune_context(params, s)
            if embedding:
                tune_embedding_context(params, s)

        model = LoadedModel(path, plan, self._tune_model, tune_context)
        if s.warmup:
            model.warmup()
        return model

    def _tune_model(self, params: lc.llama_model_params) -> None:
        flags.tune_model(params, self.settings)
        report = self.on_load_progress
        if report is not None:
            def progress(value: float, _: object) -> bool:
                report(value)
                return True  # go on loading

            self._progress_callback = lc.llama_progress_callback(progress)  # kept alive here
            params.progress_callback = self._progress_callback

    def _defaults(self) -> EngineDefaults:
        s = self.settings
        sampling = SamplingSettings(
            temperature=s.temp, dynatemp_range=s.dynatemp_range, dynatemp_exponent=s.dynatemp_exp,
            top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, typical_p=s.typical_p,
            top_n_sigma=s.top_n_sigma, xtc_probability=s.xtc_probability,
            xtc_threshold=s.xtc_threshold, repeat_last_n=s.repeat_last_n,
            repeat_penalty=s.repeat_penalty, presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty, dry_multiplier=s.dry_multiplier,
            dry_base=s.dry_base, dry_allowed_length=s.dry_allowed_length,
            dry_penalty_last_n=s.dry_penalty_last_n,
            dry_sequence_breakers=[flags.process_escapes(b) if s.escape else b
                                   for b in s.dry_sequence_breaker] or ["\n", ":", '"', "*"],
            mirostat=s.mirostat, mirostat_tau=s.mirostat_ent, mirostat_eta=s.mirostat_lr,
            seed=DEFAULT_SEED if s.seed < 0 else s.seed, ignore_eos=s.ignore_eos,
            samplers=normalize_samplers(flags.sampler_names(s)),
        )
        grammar, schema = flags.default_grammar(s)
        if schema and not grammar:
            grammar = str(json_schema_to_gbnf(schema))
        return EngineDefaults(sampling=sampling, n_predict=s.n_predict, n_keep=s.keep,
                              cache_prompt=s.cache_prompt, special=s.special,
                              model_alias=self.model_id, worker_id=self.worker_id,
                              grammar=grammar, logit_bias=flags.default_logit_bias(s),
                              cont_batching=s.cont_batching, spm_infill=s.spm_infill,
                              context_shift=s.context_shift, cache_reuse=s.cache_reuse,
                              stop=[flags.process_escapes(r) if s.escape else r
                                    for r in s.reverse_prompt],
                              n_probs_max=s.n_probs_max)

    def _arq_worker(self, pool: ArqRedis, queue: str, functions: list[Any],
                    max_jobs: int) -> WakeableWorker:
        return WakeableWorker(
            functions, queue_name=queue, redis_pool=pool, max_jobs=max_jobs,
            job_timeout=JOB_TIMEOUT_S, max_tries=MAX_TRIES, keep_result=0,
            poll_delay=self.settings.poll_delay,
            handle_signals=False, ctx={"runtime": self}, job_serializer=serialize_job,
            job_deserializer=deserialize_job, log_results=False,
        )

    async def _listen(self, *workers: WakeableWorker) -> None:
        """Wake-ups for our queues, cancellations and reasoning ends, on one pub/sub connection."""
        assert self.redis is not None and self.engine is not None
        by_channel = {keys.wake_channel(w.queue_name): w for w in workers}
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        while True:
            try:
                await pubsub.subscribe(keys.CANCEL_CHANNEL, keys.CONTROL_CHANNEL, *by_channel)
                async for message in pubsub.listen():
                    self._on_message(message, by_channel)
            except RedisError as error:  # resubscribes when Redis answers again
                log.warning("listener lost Redis (%s); reconnecting", error)
                for worker in workers:
                    worker.wake.set()  # jobs enqueued meanwhile announced nothing
                await asyncio.sleep(REDIS_RETRY_S)

    def _on_message(self, message: dict[str, Any],
                    by_channel: dict[str, WakeableWorker]) -> None:
        assert self.engine is not None
        if message["type"] != "message":
            return
        channel = message["channel"].decode()
        try:
            data = message["data"].decode()
        except UnicodeDecodeError:  # junk anyone may publish: it must not stop the listener
            log.warning("malformed message on %s: %r", channel, message["data"][:100])
            return
        if channel == keys.CANCEL_CHANNEL:
            self.engine.cancel(data)
            if self.embedder is not None:
                self.embedder.cancel(data)
        elif channel == keys.CONTROL_CHANNEL:
            self.engine.end_reasoning(data)
        elif channel in by_channel:
            by_channel[channel].wake.set()

    # -- jobs -----------------------------------------------------------------------------

    async def completion(self, job: CompletionJob) -> None:
        """Run a completion (under the lease the caller took)."""
        assert self.engine is not None and self.publisher is not None and self.redis is not None
        try:  # tokenizing, schema conversion, grammar: off the loop that renews leases
            request = await asyncio.to_thread(self.engine.prepare, job)
        except LlamaqError as error:
            self.publisher.publish([(job.job_id, ErrorEvent(error=error.to_info()))])
            return
        if self.draining:
            request.sampler.free()
            raise HandBack()
        done = self.publisher.expect(job.job_id)
        self.engine.submit(request)
        if await self.redis.exists(keys.job_cancel(job.job_id)):
            self.engine.cancel(job.job_id)  # cancelled while it was being prepared
        try:
            await done
        except asyncio.CancelledError:
            self.engine.cancel(job.job_id)
            raise

    async def decision(self, job: DecisionJob) -> None:
        """Answer a /v1/systemone request (worker/decisions.py): the engine runs it in slots,
        in the same decode steps as the completions."""
        engine, publisher = self._engine(), self.publisher
        assert publisher is not None and self.redis is not None
        caps = self._decision_caps
        try:
            if caps is None:
                raise NotSupported("this model is not a decision model: /v1/systemone needs "
                                   "one (or a worker started with --decisions)")
            request = await asyncio.to_thread(plan_decision, job, engine.model.vocab, caps,
                                              engine.model.n_ctx_slot)
        except LlamaqError as error:
            publisher.publish([(job.job_id, ErrorEvent(error=error.to_info()))])
            return
        if self.draining:
            raise HandBack()
        done = publisher.expect(job.job_id)
        engine.decisions.submit(request)
        if await self.redis.exists(keys.job_cancel(job.job_id)):
            engine.cancel(job.job_id)
        try:
            await done
        except asyncio.CancelledError:
            engine.cancel(job.job_id)
            raise

    async def slot_action(self, job: SlotActionJob) -> None:
        """Save a slot's KV to object storage, restore it (possibly saved by another worker),
        or erase it; the engine runs it while the slot is idle."""
        engine, model = self._engine(), self._engine().model
        if not self.settings.slot_save_path:
            raise NotSupported(
                "This server does not support slots action. Start it with `--slot-save-path`")
        snapshots = SlotSnapshotStore(open_store(self.settings.slot_save_path,
                                                 self.settings.s3_endpoint_url))
        if job.action != "erase":
            try:
                check_slot_name(job.filename)
            except InvalidKey:
                raise InvalidRequest("Invalid filename") from None
        started = time.perf_counter()
        if job.action == "save":
            data, tokens = await asyncio.wrap_future(
                engine.run_on_slot(job.id_slot, lambda slot: save_slot(model, slot)))
            meta = SnapshotMeta(model=self.model_id, tokens=tokens)
            await asyncio.to_thread(snapshots.save, job.filename, data, meta.model_dump())
            n_tokens, n_bytes = len(tokens), len(data)
        elif job.action == "restore":
            try:
                data, stored = await asyncio.to_thread(snapshots.load, job.filename)
            except ObjectNotFound:
                raise restore_error(f"no slot save file named {job.filename!r}") from None
            except StorageUnavailable:
                raise
            except StorageError:  # unreadable metadata
                raise restore_error("invalid slot save file") from None
            tokens = check_snapshot(stored, self.model_id).tokens
            n_bytes = await asyncio.wrap_future(engine.run_on_slot(
                job.id_slot, lambda slot: restore_slot(model, slot, data, tokens)))
            n_tokens = len(tokens)
        else:
            n_tokens = await asyncio.wrap_future(
                engine.run_on_slot(job.id_slot, lambda slot: erase_slot(model, slot)))
            n_bytes = 0
        self._final(job.job_id, SlotActionResult(
            action=job.action, id_slot=job.id_slot, filename=job.filename, n_tokens=n_tokens,
            n_bytes=n_bytes, ms=(time.perf_counter() - started) * 1000))

    async def embed(self, job: EmbeddingJob | RerankJob) -> None:
        """An embedding or rerank job, on a worker started with --embedding or --rerank."""
        if self.embedder is None:
            raise NotSupported("This server does not support embeddings. Start it with "
                               "`--embeddings`")
        await run_embed_job(self, job)

    async def tokenize(self, job: TokenizeJob) -> None:
        """In a thread: a big body must not starve the loop that renews leases."""
        self._final(job.job_id, await asyncio.to_thread(self._tokenize, job))

    def _tokenize(self, job: TokenizeJob) -> TokenizeResult:
        vocab = self._engine().model.vocab
        ids = vocab.tokenize(job.content, job.add_special, job.parse_special)
        tokens: list[int] | list[TokenPiece] = ids
        if job.with_pieces:
            tokens = [TokenPiece(id=t, piece=_piece_json(vocab.piece(t, True))) for t in ids]
        return TokenizeResult(tokens=tokens)

    async def detokenize(self, job: DetokenizeJob) -> None:
        vocab = self._engine().model.vocab
        content = await asyncio.to_thread(
            vocab.detokenize, [t for t in job.tokens if vocab.valid(t)])
        self._final(job.job_id, DetokenizeResult(content=content))

    def _final(self, job_id: str,
               result: TokenizeResult | DetokenizeResult | SlotActionResult) -> None:
        assert self.publisher is not None
        self.publisher.publish([(job_id, FinalEvent(result=result))])

    def _engine(self) -> Engine:
        assert self.engine is not None
        return self.engine

    def fail(self, job_id: str, error: Exception) -> None:
        assert self.publisher is not None
        if isinstance(error, LlamaqError):
            info = error.to_info()
        else:
            log.exception("job %s: failed", job_id, exc_info=error)
            info = ServerError(f"internal error: {redact(str(error))}").to_info()
        self.publisher.publish([(job_id, ErrorEvent(error=info))])


def _piece_json(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
