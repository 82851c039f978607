"""The body of a decision job (POST /v1/systemone; worker/decisions/run.py): planned in a thread,
run by the engine in slots, in the same decode steps as the completions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from scheduler.contract import keys
from scheduler.contract.errors import LlamaqError, NotSupported
from scheduler.contract.jobs import DecisionJob
from scheduler.contract.results import ErrorEvent
from worker.decisions.plan import plan_decision
from worker.jobs.parts import HandBack, WorkerParts
from worker.runtime.media import MediaPrompt


async def _media_of(parts: WorkerParts, job: DecisionJob
                    ) -> Callable[[str], MediaPrompt] | None:
    """How the prefix is read with the job's media (their bytes fetched now; decoded and
    encoded by the projector on the planning thread); None without media or projector."""
    projector = parts.engine.model.projector
    if not job.media or projector is None:
        return None
    data = await parts.media().fetch(job.media)
    return lambda prefix: projector.tokenize(prefix, job.media_marker, data, add_special=True)


async def run(parts: WorkerParts, job: DecisionJob) -> None:
    engine, publisher = parts.engine, parts.publisher
    caps = parts.decision_caps
    try:
        if caps is None:
            raise NotSupported("this model is not a decision model: /v1/systemone needs "
                               "one (or a worker started with --decisions)")
        plan = engine.model.plan
        request = await asyncio.to_thread(plan_decision, job, engine.model.vocab, caps,
                                          engine.model.n_ctx_slot,
                                          min(plan.n_ubatch, plan.n_batch),
                                          parts.decision_prompter,
                                          await _media_of(parts, job))
    except LlamaqError as error:
        publisher.publish([(job.job_id, ErrorEvent(error=error.to_info()))])
        return
    if parts.draining:
        raise HandBack()
    done = publisher.expect(job.job_id)
    engine.decisions.submit(request)
    if await parts.redis.exists(keys.job_cancel(job.job_id)):
        engine.cancel(job.job_id)
    try:
        await done
    except asyncio.CancelledError:
        engine.cancel(job.job_id)
        raise
