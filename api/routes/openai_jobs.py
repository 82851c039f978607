"""Running the jobs of an OpenAI-style request on the fleet: the request's context, several
choices as several jobs, and SSE streams that merge their events by choice index."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sanic import Request

from api.errors import sse_error
from api.fleet import Fleet
from api.settings import ApiSettings
from api.sse import open_stream
from scheduler.client import ChoiceEvent, merge_events
from scheduler.errors import InvalidRequest, LlamaqError, Unavailable
from scheduler.jobs import CompletionJob
from scheduler.registry import WorkerInfo
from scheduler.results import CompletionResult, FinalEvent, TokenEvent
from scheduler.slot_ids import locate_slot, slot_offset

DONE = "data: [DONE]\n\n"


@dataclass
class OpenAIContext:
    request: Request
    fleet: Fleet
    settings: ApiSettings

    @classmethod
    def of(cls, request: Request) -> OpenAIContext:
        return cls(request, request.app.ctx.fleet, request.app.ctx.settings)

    @property
    def model_id(self) -> str:
        return self.settings.model_id()

    async def workers(self) -> list[WorkerInfo]:
        """The model's live workers; none yet is the spec's 503 "Loading model"."""
        workers = await self.fleet.workers(self.model_id)
        if not workers:
            raise Unavailable("Loading model")
        return workers

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
        if choices > 1 or id_slot >= 0:
            workers = await self.workers()
            n_slots = max(worker.n_slots for worker in workers)
            if choices > n_slots:
                raise InvalidRequest(f"n ({choices}) exceeds the number of slots ({n_slots})")
            if id_slot >= 0:
                worker, local_id = locate_slot(workers, id_slot)
                if choices > worker.n_slots:  # that worker runs every choice
                    raise InvalidRequest(
                        f"n ({choices}) exceeds the number of slots ({worker.n_slots})")
                for job in jobs:
                    job.worker_id, job.id_slot = worker.worker_id, local_id

    async def run(self, jobs: list[CompletionJob]) -> list[CompletionResult]:
        """Every job's final result, in the jobs' order."""
        results = await asyncio.gather(*(self.fleet.jobs.run(job) for job in jobs))
        completed = [result for result in results if isinstance(result, CompletionResult)]
        if len(completed) != len(jobs):
            raise Unavailable("a worker answered a completion with another kind of result")
        return completed

    async def stream(self, jobs: list[CompletionJob],
                     render: Callable[[int, TokenEvent | FinalEvent], Iterable[str]],
                     end: Callable[[], Iterable[str]] = tuple,
                     terminator: str = DONE) -> None:
        """SSE of the jobs' events, each rendered to framed SSE text by `render`; then `end()`
        and `terminator`. An error before the first event is a plain JSON error response
        (as OpenAI does); after it, an error event in the stream. Leaving early (client gone)
        cancels the jobs."""
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(self.fleet.jobs.submit(job))
                       for job in jobs]
            merged = merge_events(streams)
            item: ChoiceEvent | None = await anext(merged)
            response = await open_stream(self.request)
            try:
                while item is not None:
                    for text in render(*item):
                        await response.send(text)
                    item = await anext(merged, None)
                for text in end():
                    await response.send(text)
                if terminator:
                    await response.send(terminator)
            except LlamaqError as error:
                await response.send(sse_error(error))
            await response.eof()


