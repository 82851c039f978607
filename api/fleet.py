"""The api process's connections to the fleet: Redis, the arq queue, the event hub; and the
placement service (api/placement.py) every route asks where its jobs may run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from arq.connections import ArqRedis
from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.cold_start import ColdStart
from api.embedding_batcher import EmbeddingBatcher
from api.latency import Latency
from api.placement import Placement
from api.prompt_log import PromptLog
from api.queue_stats import QueueStats
from api.tenants.config import Tenant
from api.tenants.service import CURRENT, TenantScope
from scheduler import fair_share
from scheduler.affinity import DEFAULT_MIN_CHARS, Affinity, PrefixRouter
from scheduler.batches import Batches
from scheduler.client import JobClient, QueueLimit, QueueRoom
from scheduler.connections import open_arq, open_redis
from scheduler.contract import keys, limits
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, DecisionJob
from scheduler.contract.results import FinalEvent, StartedEvent, TokenEvent
from scheduler.hub import EventHub
from scheduler.job_events import AnyJob, JobEvents
from scheduler.leases import counters, waiting_jobs
from scheduler.registry import Registry, WorkerInfo

log = logging.getLogger(__name__)

WORKERS_CACHE_S = 0.5
LAST_EVENTS_READ = 4
"""Events read back from an abandoned stream's job's log to charge its tokens (its newest
token or final event is among them: a cancel's error comes after it)."""
QUEUE_PER_SLOT = 4
OnEvent = Callable[[TokenEvent | FinalEvent | StartedEvent], Awaitable[None]]
CheckServes = Callable[[str, str], Awaitable[None]]
"""Refuses a capability (the second argument) the model's live workers do not serve."""


class CheckedJobClient(JobClient):
    """A job client that checks every completion against the limits before it exists on
    Redis (whatever route made it), and caps n_probs; a completion for a model whose workers
    serve only embeddings is the spec's 501."""

    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float,
                 queue_limit: QueueLimit | None = None,
                 n_probs_max: int = limits.DEFAULT_N_PROBS_MAX,
                 check_serves: CheckServes | None = None,
                 affinity: Affinity | None = None, migration_limit: int = 0) -> None:
        super().__init__(redis, arq, hub, timeout_s, queue_limit, affinity)
        self.n_probs_max = n_probs_max
        self._check_serves = check_serves
        self.migration_limit = migration_limit
        """--migration-limit, set on every completion (scheduler/migration.py)."""
        self.cold_start: ColdStart | None = None
        """Holds the jobs of a model with no live worker (api/cold_start.py)."""
        self.prompt_log: PromptLog | None = None
        """--log-prompts-dir: every completion's prompt written to a file (api/prompt_log.py)."""
        self.latency: Latency | None = None
        """Times streamed completions' tokens (api/latency.py)."""

    @contextlib.asynccontextmanager
    async def submit(self, job: AnyJob,  # type: ignore[override]
                     queue: str | None = None) -> AsyncIterator[JobEvents]:
        """Under a tenant (api/tenants/service.py CURRENT): admitted by its limits (429),
        its tokens metered, a `batch` tenant's job in the background lane."""
        scope = CURRENT.get()
        if isinstance(job, CompletionJob):
            limits.check_completion(job, self.n_probs_max)
            job.priority = request_priority(job.priority, None if scope is None
                                            else scope.tenant)
            job.migration_limit = self.migration_limit
            if self._check_serves is not None:
                await self._check_serves(job.model, "completion")
            if self.prompt_log is not None:
                await self.prompt_log.record(job)
        hold = None
        if self.cold_start is not None and queue is None:  # not a batch's background job
            hold = await self.cold_start.hold(job.model, job.job_id)
        try:
            async with self._tenant_submit(job, queue) as events:
                events.hold = hold
                if self.latency is not None and isinstance(job, CompletionJob) and job.stream \
                        and queue is None:
                    events.on_event = self.latency.watch(job.model, events.on_event)
                yield events
        finally:
            if hold is not None:
                with contextlib.suppress(RedisError):  # its member expires with the deadline
                    await asyncio.shield(hold.release())

    @contextlib.asynccontextmanager
    async def _tenant_submit(self, job: AnyJob, queue: str | None) -> AsyncIterator[JobEvents]:
        scope = CURRENT.get()
        if scope is None:
            async with super().submit(job, queue) as events:
                yield events
            return
        if isinstance(job, CompletionJob):
            job.tenant = scope.name
            job.weight = scope.tenant.weight
            job.cache_salt = scope.cache_salt  # its caches are its cache group's alone
            job.learn_lookup = scope.tenant.share_lookup_cache
        elif isinstance(job, DecisionJob):
            job.cache_salt = scope.cache_salt
        async with scope.job(job) as meter, super().submit(job, queue) as events:
            events.on_event = meter.on_event
            if isinstance(job, CompletionJob):
                events.on_event = self._timed(scope, job, meter.on_event)
            meter.events = events
            try:
                yield events
            finally:
                if isinstance(job, CompletionJob):
                    await asyncio.shield(self._settle(job, meter.seen))

    @staticmethod
    def _timed(scope: TenantScope, job: CompletionJob, on_event: OnEvent) -> OnEvent:
        """`on_event`, and the job's wait in the queues (to its first "started") counted for
        its tenant and priority (docs/fairness.md)."""
        queued = time.monotonic()
        started = False

        async def timed(event: TokenEvent | FinalEvent | StartedEvent) -> None:
            nonlocal started
            if not started and isinstance(event, StartedEvent):
                started = True
                try:
                    await scope.service.limits.count_wait(scope.name, job.priority or 0,
                                                          time.monotonic() - queued)
                except RedisError as exc:
                    log.warning("job %s: wait not counted: %r", job.job_id, exc)
            await on_event(event)

        return timed

    async def _settle(self, job: CompletionJob, took: int) -> None:
        """The job's tenant's fair share learns what it really took (scheduler/fair_share.py);
        with Redis away the estimate stands."""
        try:
            await fair_share.settle(self._redis, job, took)
        except RedisError as exc:
            log.warning("job %s: fair share not settled: %r", job.job_id, exc)

    @contextlib.asynccontextmanager
    async def attach(self, job: AnyJob) -> AsyncIterator[JobEvents]:
        """A resumed stream's job, with the migration limit its submit set: a migration while
        it is resumed is waited for, not ended with 503. Under a tenant it holds its place and
        meters its tokens as the request did (api/tenants/service.py `TenantScope.job`)."""
        if isinstance(job, CompletionJob):
            job.migration_limit = self.migration_limit
        scope = CURRENT.get()
        async with super().attach(job) as events:
            if scope is None:
                yield events
                return
            async with scope.job(job, resumed=True, ended=events.ended_in_log) as meter:
                events.on_event = meter.on_event
                meter.events = events
                yield events

    def cancel_later(self, record_id: str, holder: str, job_ids: list[str],
                     after: Callable[[bool], Awaitable[None]] | None = None) -> None:
        """Under a tenant, the jobs keep their places while a resume may come; after the
        grace this pod lets them go (freed and their unread tokens charged when nobody
        resumed)."""
        scope = CURRENT.get()
        if scope is None or after is not None:
            super().cancel_later(record_id, holder, job_ids, after)
            return

        async def settle(resumed: bool) -> None:
            last = {} if resumed else {
                job_id: await self._hub.read_last(job_id, LAST_EVENTS_READ)
                for job_id in job_ids}
            await scope.let_go(job_ids, resumed, last)

        super().cancel_later(record_id, holder, job_ids, settle)


def request_priority(asked: int | None, tenant: Tenant | None) -> int:
    """A completion's priority: the one it asked, else its tenant's default (0 without
    --tenants); below the tenant's `min_priority` a 400 naming both."""
    if asked is None:
        return tenant.default_priority if tenant is not None else 0
    if tenant is not None and tenant.min_priority is not None and asked < tenant.min_priority:
        raise InvalidRequest(f"Field 'priority': tenant '{tenant.name}' may ask priority "
                             f"{tenant.min_priority} or higher (lower is more urgent), but "
                             f"got {asked}")
    return asked


@dataclass
class Fleet:
    redis: Redis
    arq: ArqRedis
    hub: EventHub
    jobs: JobClient
    registry: Registry
    queue_max: int = 0
    placement: Placement = field(init=False)
    embeddings: EmbeddingBatcher = field(init=False)
    """Online embedding requests go through it (api/embedding_batcher.py)."""
    _workers: dict[str, tuple[float, list[WorkerInfo]]] = field(default_factory=dict)
    latency: Latency = field(default_factory=Latency)
    """This pod's time to first token and inter-token latency, per model (api/latency.py)."""

    def __post_init__(self) -> None:
        self.placement = Placement(self.workers, self.registry.loads)
        self.embeddings = EmbeddingBatcher(self.jobs.run_embedding)

    @classmethod
    async def connect(cls, redis_url: str, timeout_s: float, queue_max: int = 0,
                      n_probs_max: int = limits.DEFAULT_N_PROBS_MAX,
                      prefix_affinity: int = DEFAULT_MIN_CHARS,
                      coalesce_embeddings: bool = True,
                      migration_limit: int = 0,
                      cold_start_timeout: float = 0.0,
                      prompt_log: PromptLog | None = None) -> Fleet:
        """`prefix_affinity`: the shortest shared prompt beginning (characters) that routes
        a completion to the worker holding it (0: off; scheduler/affinity.py)."""
        redis = open_redis(redis_url)
        arq = await open_arq(redis_url)
        hub = EventHub(redis)
        await hub.start()
        fleet = cls(redis, arq, hub, JobClient(redis, arq, hub, timeout_s), Registry(redis),
                    queue_max)
        affinity = Affinity(redis, PrefixRouter(prefix_affinity)) if prefix_affinity > 0 else None
        fleet.jobs = CheckedJobClient(redis, arq, hub, timeout_s, fleet.queue_limit, n_probs_max,
                                      fleet.placement.check_serves, affinity, migration_limit)
        fleet.jobs.cold_start = ColdStart(redis, cold_start_timeout, fleet.has_workers)
        fleet.placement.cold_wait = fleet.jobs.cold_start.wait
        fleet.jobs.prompt_log = prompt_log
        fleet.jobs.latency = fleet.latency
        fleet.embeddings = EmbeddingBatcher(fleet.jobs.run_embedding, coalesce_embeddings)
        return fleet

    async def has_workers(self, model_id: str) -> bool:
        """Whether the model has a live worker (asked for every job: the cold-start hold). A
        young cached list that has one answers, as the registry itself counts a worker live
        for HEARTBEAT_TTL_S after its last beat; an empty one is read again, so that a model's
        first worker is seen at once."""
        cached = self._workers.get(model_id)
        if cached is not None and cached[1] and time.monotonic() - cached[0] < WORKERS_CACHE_S:
            return True
        return bool(await self.workers(model_id, fresh=True))

    async def queue_limit(self, model_id: str) -> QueueRoom | None:
        """--queue-max, else 4 x the live slots of the model, counted over its shared queue
        and its live workers' own queues (routed jobs); None (no bound) while it has no live
        slot: the request waits for a worker instead of being refused."""
        workers = await self.workers(model_id)
        queues = (keys.slot_queue(model_id),
                  *(keys.worker_queue(model_id, w.worker_id) for w in workers))
        if self.queue_max > 0:
            return QueueRoom(self.queue_max, queues)
        slots = sum(w.n_slots for w in workers)
        return QueueRoom(QUEUE_PER_SLOT * slots, queues) if slots else None

    async def workers(self, model_id: str, fresh: bool = False) -> list[WorkerInfo]:
        """The model's live workers in registry order (cached for a moment: it is read for
        every response that shows a slot id)."""
        cached = self._workers.get(model_id)
        if not fresh and cached is not None and time.monotonic() - cached[0] < WORKERS_CACHE_S:
            return cached[1]
        workers = await self.registry.live_workers(model_id)
        self._workers[model_id] = (time.monotonic(), workers)
        return workers

    async def queue_stats(self, model_id: str, workers: list[WorkerInfo]) -> QueueStats:
        queues = [keys.slot_queue(model_id), keys.embed_queue(model_id),
                  keys.embed_background_queue(model_id),
                  *(keys.worker_queue(model_id, w.worker_id) for w in workers)]
        depth, oldest = 0, 0.0
        for queue in queues:
            waiting, waited = await waiting_jobs(self.redis, queue)
            depth, oldest = depth + waiting, max(oldest, waited)
        counts = await counters(self.redis, model_id)
        failed = {k.removeprefix("failed:"): v for k, v in counts.items()
                  if k.startswith("failed:")}
        batches = Batches(self.redis)
        lines = await batches.counters()
        buckets = {k.removeprefix("stall_le:"): v for k, v in counts.items()
                   if k.startswith("stall_le:")}
        return QueueStats(depth=depth, oldest_s=oldest, retried=counts.get("retried", 0),
                          migrated=counts.get("migrated", 0),
                          preempted=counts.get("preempted", 0), stall_buckets=buckets,
                          stall_count=counts.get("stall_count", 0),
                          stall_sum_s=counts.get("stall_sum_ms", 0) / 1000,
                          failed=failed, batches_in_progress=len(await batches.active(model_id)),
                          batch_lines_completed=lines.get("lines_completed", 0),
                          batch_lines_failed=lines.get("lines_failed", 0))

    async def close(self) -> None:
        await self.hub.close()
        await self.arq.aclose()
        await self.redis.aclose()
