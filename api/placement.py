"""Where a request's jobs may run, decided in one place for every route: the model's live
workers (none yet is llama-server's 503 "Loading model"), the ones that serve what the request
asks (completion, embedding, rerank, decisions: none is the spec's 501), and jobs pinned to a
worker: several choices of one prompt (`n`, `n_cmpl`) bounded by the slots, kept on one worker
when they share a prompt cache, and `id_slot` (a fleet-wide slot id, scheduler/slot_ids.py).

The jobs reach the workers' queues through the job client (scheduler/client.py); placement only
sets `worker_id` and `id_slot` on them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from scheduler.contract import limits
from scheduler.contract.errors import InvalidRequest, NotSupported, Unavailable
from scheduler.contract.jobs import CompletionJob
from scheduler.registry import WorkerInfo, least_loaded
from scheduler.slot_ids import locate_slot

LOADING = "Loading model"
NO_EMBEDDINGS = "This server does not support embeddings. Start it with `--embeddings`"
NO_RERANK = "This server does not support reranking. Start it with `--reranking`"
NO_COMPLETIONS = ("This server does not support completions: its workers were started with "
                  "`--embedding` or `--rerank`")
NO_DECISIONS = ("this model is not a decision model: /v1/systemone needs one (or a worker "
                "started with --decisions)")
DECISIONS_ONLY = ("This model serves only /v1/systemone: it is a {family} decision model, text "
                  "generation is not available")
REFUSALS = {"completion": NO_COMPLETIONS, "embedding": NO_EMBEDDINGS, "rerank": NO_RERANK}
"""What a request for each capability is told when no live worker of the model serves it."""

WorkersOf = Callable[..., Awaitable[list[WorkerInfo]]]
"""The model's live workers, in registry order (api/fleet.py Fleet.workers: model_id, fresh)."""
LoadsOf = Callable[[list[WorkerInfo]], Awaitable[dict[str, float]]]
"""Each worker's load (scheduler/registry.py Registry.loads)."""


class Placement:
    def __init__(self, workers_of: WorkersOf, loads_of: LoadsOf) -> None:
        self._workers_of = workers_of
        self._loads_of = loads_of
        self.cold_wait: Callable[[str], Awaitable[None]] | None = None
        """Waits for a model's first live worker (api/cold_start.py), for `workers(wait=)`."""

    async def workers(self, model_id: str, fresh: bool = False,
                      wait: bool = False) -> list[WorkerInfo]:
        """The model's live workers; none yet is the spec's 503 "Loading model" (`wait`: a
        request that will run a job waits for one first, under --cold-start-timeout)."""
        workers = await self._workers_of(model_id, fresh=fresh)
        if not workers and wait and self.cold_wait is not None:
            await self.cold_wait(model_id)
            workers = await self._workers_of(model_id, fresh=True)
        if not workers:
            raise Unavailable(LOADING)
        return workers

    async def capabilities(self, model_id: str) -> set[str] | None:
        """What the model's live workers serve (None: no live worker, nothing is known yet)."""
        workers = await self._workers_of(model_id)
        if not workers:
            return None
        return {c for worker in workers for c in worker.capabilities()}

    async def check_serves(self, model_id: str, capability: str) -> None:
        """A `capability` the model's live workers do not serve is the spec's 501; with no live
        worker yet nothing is refused (the job waits for one)."""
        workers = await self._workers_of(model_id)
        if not workers or capability in {c for w in workers for c in w.capabilities()}:
            return
        families = {w.meta.decisions.family.name for w in workers
                    if w.meta.decisions is not None and w.meta.decisions.family is not None}
        if capability == "completion" and families:
            raise NotSupported(DECISIONS_ONLY.format(family=", ".join(sorted(families))))
        raise NotSupported(REFUSALS[capability])

    async def serving(self, model_id: str, capability: str) -> WorkerInfo:
        """A live worker of the model that serves `capability` (embedding, rerank)."""
        for worker in await self.workers(model_id):
            if capability in worker.capabilities():
                return worker
        raise NotSupported(REFUSALS[capability])

    async def deciding(self, model_id: str) -> tuple[list[WorkerInfo], list[WorkerInfo]]:
        """The model's live workers and those of them that answer decisions (native, or under
        the worker's --decisions); none of them is a 501."""
        workers = await self.workers(model_id)
        able = [w for w in workers if w.meta.decisions is not None]
        if not able:
            raise NotSupported(NO_DECISIONS)
        return workers, able

    async def slot(self, model_id: str, id_slot: int) -> tuple[WorkerInfo, int]:
        """The worker that holds fleet slot `id_slot` now, and the slot's id on it (an id past
        the fleet's slots, or no worker, is a 400)."""
        return locate_slot(await self._workers_of(model_id, fresh=True), id_slot)

    async def pick(self, workers: list[WorkerInfo], n_jobs: int = 1) -> WorkerInfo:
        """The least loaded of `workers` that has `n_jobs` slots."""
        return least_loaded(workers, await self._loads_of(workers), n_jobs)

    async def pin(self, model_id: str, jobs: Sequence[CompletionJob], *, choices: int,
                  id_slot: int, field: str, together: bool = False) -> None:
        """Check the `choices` per prompt (`field`: "n" or "n_cmpl") against the slots, as
        llama-server does, and pin the jobs: with `id_slot` >= 0 every job runs on the worker
        that holds that slot, in it; with `together` each prompt's choices run on one worker
        (the least loaded), so that they share its prompt cache. What they may hold on Redis is
        bounded first (413: limits.budget_request)."""
        limits.budget_request(jobs)
        if choices <= 1 and id_slot < 0:
            return
        workers = await self.workers(model_id)
        if id_slot >= 0:
            if not together:
                _check_choices(field, choices, max(worker.n_slots for worker in workers))
            worker, local_id = locate_slot(workers, id_slot)
            _check_choices(field, choices, worker.n_slots)  # that worker runs every choice
            for job in jobs:
                job.worker_id, job.id_slot = worker.worker_id, local_id
            return
        if not together:
            _check_choices(field, choices, max(worker.n_slots for worker in workers))
            return
        loads = await self._loads_of(workers)
        for first in range(0, len(jobs), choices):
            worker = least_loaded(workers, loads, choices)
            _check_choices(field, choices, worker.n_slots)
            for job in jobs[first : first + choices]:
                job.worker_id = worker.worker_id


def _check_choices(field: str, choices: int, n_slots: int) -> None:
    if choices > n_slots:
        raise InvalidRequest(f"{field} ({choices}) exceeds the number of slots ({n_slots})")
