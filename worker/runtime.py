"""A worker process: loads the model, runs the engine, takes jobs from arq, publishes events,
keeps its registry entry alive and listens for cancellations and wake-ups.

Owns: building the worker whole (`serve`: Redis, the model, then WorkerRuntime with its engine,
publisher and leases, none of them optional) and taking it down; draining; the background
loops (listener, lease renewal, reports); the job bodies (completion, decision, slot actions,
tokenize). Hands off: what a job function does around its body (worker/jobrun.py), the model
and the engine's defaults from the settings (worker/startup.py), the engine
(worker/engine.py), embeddings and rerank (worker/embed_jobs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from arq.connections import ArqRedis, create_pool
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
    translate,
)
from scheduler.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.leases import Leases, count_failure
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.registry import Registry, WorkerInfo, write_heartbeat, write_slots
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
from worker.arq_worker import WakeableWorker
from worker.decision_plan import decision_caps, plan_decision
from worker.embed_jobs import (
    embed_functions,
    embed_queues,
    embedding_mode,
    run_embed_job,
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
from worker.model import LoadedModel, ModelLoadError
from worker.model_source import fetch_model
from worker.publisher import EventPublisher
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
from worker.startup import engine_defaults, load_model

log = logging.getLogger(__name__)

JOB_TIMEOUT_S = 7 * 24 * 3600
"""Generations are bounded by n_predict, the context and cancellation, not by arq's timer
(a dead worker's jobs are freed by their lease, not by this)."""
SLOT_REPORT_MIN_GAP_S = 0.1
"""Slot changes are reported at most this often (the last one always is)."""
REDIS_RETRY_S = 1.0
QUICK_PREPARE_MAX_CHARS = 4096
"""Up to this many characters of plain prompt are tokenized on the event loop (see
WorkerRuntime._quick_to_prepare)."""
DRAIN_LAST_EVENTS_S = 5.0
"""After the drain timeout, how long the ended jobs' error events have to go out."""


async def serve(settings: WorkerSettings, redis_url: str, stop: asyncio.Event | None = None,
                on_load_progress: Callable[[float], None] | None = None) -> None:
    """Build the worker whole (Redis, model, engine, publisher, leases), serve until cancelled
    or until `stop` is set (then drain), and take it all down again. `on_load_progress` is
    called from the loading thread with the load's progress, 0..1 (router mode publishes it
    in /models/sse loading events)."""
    if settings.decisions and embedding_mode(settings):
        raise ModelLoadError("--decisions needs a worker that serves completions: it "
                             "cannot be combined with --embedding or --rerank")
    if settings.sleep_idle_seconds >= 0 and embedding_mode(settings):
        raise ModelLoadError("--sleep-idle-seconds is not built for --embedding or --rerank "
                             "workers (only completion workers sleep)")
    redis = open_redis(redis_url)
    try:
        pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                                 job_deserializer=deserialize_job)
        try:
            model_path = await fetch_model(settings, redis)
            model = await asyncio.to_thread(load_model, settings, model_path, on_load_progress)
            try:
                await WorkerRuntime(settings, redis, model).run(pool, stop)
            finally:
                model.close()
        finally:
            await pool.aclose()
    finally:
        await redis.aclose()


class WorkerRuntime:
    """A worker's parts, built together: nothing in it is missing once it exists (an
    embedder only on an --embedding/--rerank worker, decision caps only on a decision
    model)."""

    def __init__(self, settings: WorkerSettings, redis: Redis, model: LoadedModel) -> None:
        """Needs the running event loop (the publisher hands events over to it)."""
        self.settings = settings
        self.model_id = settings.model_id()
        self.worker_id = settings.worker_id or f"{uuid.uuid4().hex[:12]}"
        self.redis = redis
        self.model = model
        self.leases = Leases(redis, self.worker_id)
        self.publisher = EventPublisher(redis, self._write_metrics, self._lost, self.leases)
        self.engine = Engine(model, engine_defaults(settings, self.model_id, self.worker_id),
                             self.publisher.from_thread)
        embedding = embedding_mode(settings)
        self.embedder: Embedder | None = Embedder(model) if embedding else None
        """Set on a worker started with --embedding or --rerank (worker/embed_jobs.py)."""
        self._decision_caps: DecisionCaps | None = \
            None if embedding else decision_caps(model.path, settings.decisions)
        """Decisions run in the completion engine, on a decision model."""
        self.draining = False
        self._arq_workers: list[WakeableWorker] = []
        self._prefixes = PrefixIndex()
        self.info: WorkerInfo | None = None
        """This worker's registry entry, as its heartbeats write it."""
        self.sleeper: Sleeper | None = None
        """Idle sleep (--sleep-idle-seconds; worker/sleep.py), set once the worker runs."""

    # -- start and stop -----------------------------------------------------------------

    async def run(self, pool: ArqRedis, stop: asyncio.Event | None = None) -> None:
        """Serve until cancelled, or until `stop` is set: then drain (finish running jobs up
        to the drain timeout, hand the others back) and leave."""
        model = self.model
        self.engine.start()
        if self.embedder is not None:
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
            if self.model is not model:  # loaded again after an idle sleep: ours to close
                self.model.close()
            log.info("worker %s: stopped", self.worker_id)

    def reload_engine(self) -> None:
        """Load the model again and start a new engine on it (a worker waking from idle
        sleep; blocking: call it off the event loop); the worker's counters carry on."""
        old = self.engine
        model = load_model(self.settings, self.model.path)
        engine = Engine(model, engine_defaults(self.settings, self.model_id, self.worker_id),
                        self.publisher.from_thread)
        engine.metrics = old.metrics
        engine.on_slots_changed = old.on_slots_changed
        engine.start()
        self.model, self.engine = model, engine

    def _lost(self, job_id: str) -> None:
        """A job whose events Redis would not take: stop generating for nobody."""
        self.engine.cancel(job_id)

    async def _drain(self) -> None:
        """Stop taking jobs; hand back those not started; let running generations finish up
        to the drain timeout; end the rest with an error event."""
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

    def _write_metrics(self, pipe: Pipeline, report: bool = False) -> None:
        """Metrics and slot states, written ahead of the events that end jobs: a client that
        got its result sees its slot idle in /slots, as llama-server shows it. An embedding
        worker's slots (its completion engine's, always idle) go in its reports only."""
        metrics = (self.embedder or self.engine).metrics_snapshot()
        pipe.set(keys.worker_metrics(self.worker_id), metrics.model_dump_json(),
                 ex=keys.HEARTBEAT_TTL_S)
        if self.embedder is None or report:
            write_slots(pipe, self.worker_id, self.engine.slot_states())
        if self.embedder is None:  # cache-aware routing: only completion workers take part
            n_free = (len(self.engine.slots) - metrics.requests_processing
                      - metrics.requests_deferred)
            pipe.set(keys.worker_prefixes(self.worker_id),
                     self._prefixes.summary(self.engine.slot_jobs(), n_free).model_dump_json(),
                     ex=keys.HEARTBEAT_TTL_S)

    async def _report(self, registry: Registry, info: WorkerInfo) -> None:
        """Heartbeats, and the slots' state whenever a slot starts or ends a request."""
        changed = asyncio.Event()
        loop = asyncio.get_running_loop()

        def notify() -> None:
            loop.call_soon_threadsafe(changed.set)

        self.engine.on_slots_changed = notify
        next_heartbeat = 0.0
        while True:
            changed.clear()
            try:  # one round trip: slots, metrics, and the heartbeat when due
                async with self.redis.pipeline(transaction=False) as pipe:
                    self._write_metrics(pipe, report=True)
                    beat = time.monotonic() >= next_heartbeat
                    if beat:
                        write_heartbeat(pipe, self.info or info)
                    await pipe.execute()
                if beat:
                    next_heartbeat = time.monotonic() + keys.HEARTBEAT_EVERY_S
            except RedisError as error:  # Redis away: keep trying, the worker lives on
                log.warning("cannot report to Redis (%s); retrying", error)
                next_heartbeat = 0.0
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), next_heartbeat - time.monotonic())
            await asyncio.sleep(SLOT_REPORT_MIN_GAP_S)  # many changes at once: one report

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
        try:  # tokenizing, schema conversion, grammar: off the loop that renews leases
            if self._quick_to_prepare(job):  # a thread hop costs more than the work
                request = self.engine.prepare(job)
            else:
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

    def _quick_to_prepare(self, job: CompletionJob) -> bool:
        """A short text prompt with no grammar to compile prepares in well under a
        millisecond: on the event loop it saves the thread hand-offs of to_thread."""
        return (isinstance(job.prompt, str) and len(job.prompt) <= QUICK_PREPARE_MAX_CHARS
                and job.infill is None and not job.grammar and not job.json_schema
                and not self.engine.defaults.grammar)

    async def decision(self, job: DecisionJob) -> None:
        """Answer a /v1/systemone request (worker/decisions.py): the engine runs it in slots,
        in the same decode steps as the completions."""
        engine, publisher = self.engine, self.publisher
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
        engine, model = self.engine, self.model
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
        vocab = self.model.vocab
        ids = vocab.tokenize(job.content, job.add_special, job.parse_special)
        tokens: list[int] | list[TokenPiece] = ids
        if job.with_pieces:
            tokens = [TokenPiece(id=t, piece=_piece_json(vocab.piece(t, True))) for t in ids]
        return TokenizeResult(tokens=tokens)

    async def detokenize(self, job: DetokenizeJob) -> None:
        vocab = self.model.vocab
        content = await asyncio.to_thread(
            vocab.detokenize, [t for t in job.tokens if vocab.valid(t)])
        self._final(job.job_id, DetokenizeResult(content=content))

    def _final(self, job_id: str,
               result: TokenizeResult | DetokenizeResult | SlotActionResult) -> None:
        self.publisher.publish([(job_id, FinalEvent(result=result))])

    def fail(self, job_id: str, error: Exception) -> None:
        """End the job with `error` (translated as the api translates it; a bug is a 500)."""
        ours = translate(error)
        if ours is None:
            log.exception("job %s: failed", job_id, exc_info=error)
            ours = ServerError(f"internal error: {redact(str(error))}")
        self.publisher.publish([(job_id, ErrorEvent(error=ours.to_info()))])


def _piece_json(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
