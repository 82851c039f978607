"""The body of a completion job: prepare it (tokenize, grammar) and hand it to the engine,
which streams its events; the job ends when its last event is on Redis."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.contract.errors import LlamaqError, NotSupported
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import Continuation, ErrorEvent
from worker.engine.loop import Engine
from worker.jobs.parts import HandBack, WorkerParts
from worker.kv.slots import common_prefix
from worker.kv.tier import KvTier, TierPlan

log = logging.getLogger(__name__)

DECISIONS_ONLY = ("This model serves only /v1/systemone: it is a {family} decision model, text "
                  "generation is not available")
"""The same words as the api's (api/placement.py), for a job that reached the worker anyway."""
QUICK_PREPARE_MAX_CHARS = 4096
"""Up to this many characters of plain prompt are tokenized on the event loop (see
quick_to_prepare)."""


async def run(parts: WorkerParts, job: CompletionJob,
              resumed: Continuation | None = None) -> None:
    """Run a completion (under the lease the caller took); `resumed`: continue it where its
    dead worker stopped (scheduler/migration.py)."""
    engine = parts.engine
    caps = parts.decision_caps
    try:  # tokenizing, schema conversion, grammar: off the loop that renews leases
        if caps is not None and not caps.serves_text and caps.family is not None:
            # a job sent before the api knew this worker (clef serves only /v1/systemone)
            raise NotSupported(DECISIONS_ONLY.format(family=caps.family.name))
        if quick_to_prepare(parts, job) and resumed is None:  # a thread hop costs more
            request = engine.prepare(job)
        else:
            media = await parts.media().fetch(job.media) if job.media else None
            request = await asyncio.to_thread(engine.prepare, job, resumed, media)
    except LlamaqError as error:
        parts.publisher.publish([(job.job_id, ErrorEvent(error=error.to_info()))])
        return
    looked_up = parts.kv_tier is not None and request.media is None and request.cache_prompt \
        and not parts.model.adapters.adapters and parts.kv_tier.looks_up(request.prompt_tokens)
    if looked_up and parts.kv_tier is not None:
        request.tier = await tier_plan(parts.kv_tier, engine, request.prompt_tokens,
                                       job.cache_salt)
    if parts.draining:
        request.sampler.free()
        raise HandBack()
    done = parts.publisher.expect(job.job_id, job.event_log_max_bytes, job.reply_to)
    engine.submit(request)
    try:
        await cancelled_while_prepared(parts, job.job_id)
        await done
    except asyncio.CancelledError:
        engine.cancel(job.job_id)
        raise
    if looked_up:
        count_tier(parts, request.tier)


async def cancelled_while_prepared(parts: WorkerParts, job_id: str) -> None:
    """Cancel the run if its client cancelled it while it was being prepared. With Redis away
    the look is skipped (a cancel sent later still comes by pub/sub): raising here would end
    the job's task while the engine runs it on, and a later run of the job on this worker would
    then meet that run's cancellation as its own error (a sentinel failover did so)."""
    try:
        cancelled = await parts.redis.exists(keys.job_cancel(job_id))
    except RedisError as error:
        log.warning("job %s: cannot look for a cancel (%s); it runs", job_id, error)
        return
    if cancelled:
        parts.engine.cancel(job_id)


def count_tier(parts: WorkerParts, tier: TierPlan | None) -> None:
    """A prompt that looked the KV tier up: a hit when the engine restored a stored state into
    its slot, else a miss (none stored, not worth reading, unreadable, or the slot already held
    more); `llamaq:kv_tier_hits_total` / `kv_tier_misses_total` (the worker's counters)."""
    metrics = parts.engine.metrics  # read now: a worker woken from sleep has a new engine
    if tier is not None and tier.restored:
        metrics.kv_tier_hits_total += 1
    else:
        metrics.kv_tier_misses_total += 1


async def tier_plan(tier: KvTier, engine: Engine, prompt: list[int],
                    salt: str | None = None) -> TierPlan | None:
    """The KV tier's part in a request (`salt`: its cache salt: the slots and states of its
    tenant group only); a Redis or store problem only costs the tier."""
    cached = max((common_prefix(list(slot.tokens), prompt) for slot in engine.slots
                  if slot.salt == salt), default=0)
    try:
        return await tier.plan(prompt, cached, salt)
    except RedisError as error:
        log.warning("kv tier: lookup failed (%s): prefilled instead", error)
        return None


def quick_to_prepare(parts: WorkerParts, job: CompletionJob) -> bool:
    """A short text prompt with no grammar to compile prepares in well under a
    millisecond: on the event loop it saves the thread hand-offs of to_thread."""
    return (isinstance(job.prompt, str) and len(job.prompt) <= QUICK_PREPARE_MAX_CHARS
            and job.infill is None and not job.grammar and not job.json_schema and not job.media
            and not parts.engine.defaults.grammar)
