"""Running the jobs of an OpenAI-style request on the fleet: the request's context, several
choices as several jobs, and SSE streams that merge their events by choice index."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sanic import Request

from api.endpoints.openai.render import Envelope, random_id
from api.fleet import Fleet
from api.services import request_model, request_settings, services
from api.settings import ApiSettings
from api.streaming import Resume, StreamFormat, ping_interval, resume_of, stream_jobs
from scheduler.contract.errors import ServerError
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent
from scheduler.registry import WorkerInfo
from scheduler.slot_ids import slot_offset
from storage.base import ObjectStore

DONE = "data: [DONE]\n\n"


@dataclass
class OpenAIContext:
    request: Request | None
    """None for a batch line (api/batch/): it never streams."""
    fleet: Fleet
    settings: ApiSettings
    resume: Resume | None = None
    queue: str | None = None
    """Where the jobs go instead of the model's own queue (a batch line: its batch queue)."""
    model: str | None = None
    """The model of a batch line (there is no request to route)."""
    media_store: ObjectStore | None = None
    """Where large media go (api/media/refs.py): the pod's object store."""

    @classmethod
    def of(cls, request: Request) -> OpenAIContext:
        pod = services(request)
        return cls(request, pod.fleet, request_settings(request), media_store=pod.store)

    @property
    def store(self) -> ObjectStore:
        if self.media_store is None:
            raise ServerError("media need the object store, which this context has none of")
        return self.media_store

    @property
    def model_id(self) -> str:
        if self.request is None:
            return self.model or self.settings.model_id()
        return request_model(self.request)

    async def workers(self) -> list[WorkerInfo]:
        """The model's live workers; none yet is the spec's 503 "Loading model", after a
        wait for one under --cold-start-timeout (api/cold_start.py)."""
        return await self.fleet.placement.workers(self.model_id, wait=True)

    def verbose(self, asked: bool) -> bool:
        """Responses carry llama-server's `__verbose` debug object: the request's `verbose`,
        or the server's --verbose."""
        return asked or self.settings.debug_responses()

    async def slot_offsets(self) -> dict[str, int]:
        """Each worker's first fleet-wide slot id (to render a worker-local id_slot)."""
        workers = await self.fleet.workers(self.model_id)
        return {w.worker_id: slot_offset(workers, w.worker_id) for w in workers}

    async def prepare(self, jobs: list[CompletionJob], id_slot: int, choices: int) -> None:
        """Check `n` against the slots (llama-server's limit) and pin jobs to `id_slot`."""
        await self.fleet.placement.pin(self.model_id, jobs, choices=choices, id_slot=id_slot,
                                       field="n")

    async def run(self, jobs: list[CompletionJob]) -> list[CompletionResult]:
        """Every job's final result, in the jobs' order (a batch line's jobs are background
        jobs)."""
        for job in jobs:
            job.background = self.request is None
        return list(await asyncio.gather(*(self.fleet.jobs.run_completion(job, self.queue)
                                           for job in jobs)))

    async def envelope(self, prefix: str, stream: bool) -> Envelope:
        """The response's id and creation time: new, or those of the stream a
        `Last-Event-ID` resumes (so that the resumed stream is the same stream)."""
        envelope = Envelope(random_id(prefix), self.model_id)
        if not stream:
            return envelope
        assert self.request is not None
        self.resume = await resume_of(self.request, self.fleet,
                                      {"id": envelope.id, "created": envelope.created})
        minted = self.resume.record.minted
        return Envelope(str(minted["id"]), self.model_id, int(minted["created"]))

    def adopt_resumed(self, jobs: list[CompletionJob]) -> None:
        """A resumed stream's jobs are the stream's own (its record's ids), not new ones."""
        if self.resume is not None and self.resume.have is not None:
            for job, job_id in zip(jobs, self.resume.record.job_ids, strict=False):
                job.job_id = job_id

    async def stream(self, jobs: list[CompletionJob],
                     render: Callable[[int, TokenEvent | FinalEvent], Iterable[str]],
                     end: Callable[[], Iterable[str]] = tuple,
                     terminator: str = DONE, ping_field: float | None = None) -> None:
        """SSE of the jobs' events (api/streaming.py), each rendered to framed SSE text by
        `render`; then `end()` and `terminator`."""
        assert self.request is not None
        resume = self.resume or await resume_of(self.request, self.fleet)
        await stream_jobs(self.request, self.fleet, jobs, resume,
                          StreamFormat(render, end, terminator),
                          ping_interval(self.request, ping_field))
