"""What a job body runs on: the parts of a worker, built whole by the process
(worker/process/serve.py) and handed to every body, as arq hands its functions `ctx`.

Owns: WorkerParts, HandBack (a body's way to give its job back unstarted), publishing a final
result. Nothing here is optional once built (an embedder only on an --embedding/--rerank
worker, decision caps only on a decision model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis

from scheduler.contract.results import (
    DetokenizeResult,
    FinalEvent,
    SlotActionResult,
    TokenizeResult,
)
from scheduler.decision_meta import DecisionCaps
from scheduler.leases import Leases
from worker.decisions.systemone_heads import HeadPrompter
from worker.decisions.systemone_prompt import FamilyPrompter
from worker.embed.embedder import Embedder
from worker.engine.loop import Engine
from worker.kv.tier import KvTier
from worker.runtime.model import LoadedModel
from worker.runtime.settings import WorkerSettings
from worker.wires.media_fetch import MediaFetcher
from worker.wires.publisher import EventPublisher


class HandBack(Exception):
    """The job goes back to its queue unstarted, for another worker (this one drains)."""


@dataclass
class WorkerParts:
    """A worker's parts. `model` and `engine` are replaced when an idle worker wakes
    (worker/process/sleep.py); `draining` turns True once the worker stops taking jobs."""

    settings: WorkerSettings
    model_id: str
    worker_id: str
    redis: Redis
    leases: Leases
    publisher: EventPublisher
    model: LoadedModel
    engine: Engine
    embedder: Embedder | None
    """Set on a worker started with --embedding or --rerank (worker/jobs/embed.py)."""
    decision_caps: DecisionCaps | None
    """Decisions run in the completion engine, on a decision model."""
    decision_prompter: FamilyPrompter | HeadPrompter | None = None
    """A decision family's prompts: a label-logit family's and its labels
    (worker/decisions/systemone_prompt.py), a decision-head family's
    (worker/decisions/systemone_heads.py)."""
    draining: bool = False
    media_fetcher: MediaFetcher | None = field(default=None, repr=False)
    kv_tier: KvTier | None = None
    """--kv-store: the fleet-wide KV tier (worker/kv/tier.py)."""

    def media(self) -> MediaFetcher:
        """A job's media bytes (worker/wires/media_fetch.py), made on first use."""
        if self.media_fetcher is None:
            self.media_fetcher = MediaFetcher(self.settings.store_url,
                                              self.settings.s3_endpoint_url)
        return self.media_fetcher

    def final(self, job_id: str,
              result: TokenizeResult | DetokenizeResult | SlotActionResult) -> None:
        self.publisher.publish([(job_id, FinalEvent(result=result))])
