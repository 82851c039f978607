"""Many embedding requests, one job: requests for the same model that arrive while this pod's
job for it is in flight wait for it to end, then go to Redis together as one job (issue 29:
the hop api -> Redis -> worker -> Redis -> api is paid once for all of them). A request that
finds nothing in flight goes at once, alone: it waits for nobody. The worker decodes a job's
inputs together already; the result is split back per request, each with its own items,
usage and errors (one bad input fails only its own request, as it would alone).

Written here rather than taken from a library: the batching is over our own job contract (one
EmbeddingJob, per-input errors), and it is a few lines of asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scheduler.contract.errors import LlamaqError, error_from_info
from scheduler.contract.jobs import EmbeddingJob
from scheduler.contract.results import EmbeddingResult

MAX_INPUTS = 256
"""Inputs of one combined job at most (the rest go in the next one)."""
MAX_CHARS = 1 << 20
"""Characters of one combined job's text inputs at most (a token bound the pod can see)."""

Run = Callable[[EmbeddingJob], Awaitable[EmbeddingResult]]


@dataclass
class _Waiting:
    job: EmbeddingJob
    answer: asyncio.Future[EmbeddingResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _Line:
    """The requests of one model (and normalization) waiting, and whether a job is out."""

    waiting: list[_Waiting] = field(default_factory=list)
    running: bool = False


class EmbeddingBatcher:
    def __init__(self, run: Run, enabled: bool = True) -> None:
        """`run`: the job client's run_embedding; `enabled` False: one job per request."""
        self._run = run
        self._enabled = enabled
        self._lines: dict[tuple[str, int | None], _Line] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def embed(self, job: EmbeddingJob) -> EmbeddingResult:
        if not self._enabled or job.background:
            return await self._run(job)
        key = (job.model, job.embd_normalize)
        line = self._lines.setdefault(key, _Line())
        waiting = _Waiting(job)
        line.waiting.append(waiting)
        if not line.running:
            line.running = True
            task = asyncio.create_task(self._send(key, line))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await waiting.answer

    async def _send(self, key: tuple[str, int | None], line: _Line) -> None:
        """Send what waits, one combined job at a time, until nothing waits."""
        try:
            while line.waiting:
                group = _take(line.waiting)
                await self._answer(group)
        finally:
            line.running = False
            if not line.waiting:
                self._lines.pop(key, None)
            for waiting in line.waiting:  # cancelled (the pod stops): nobody is left hanging
                if not waiting.answer.done():
                    waiting.answer.cancel()

    async def _answer(self, group: list[_Waiting]) -> None:
        """Run one job for `group` (a lone request: its own job) and answer each request;
        when every request of it has left (clients gone), the job is cancelled on the
        worker, as a request alone cancels its job."""
        job = group[0].job if len(group) == 1 else EmbeddingJob(
            model=group[0].job.model, embd_normalize=group[0].job.embd_normalize,
            inputs=[i for w in group for i in w.job.inputs], per_input_errors=True)
        run = asyncio.ensure_future(self._run(job))

        def left(_: asyncio.Future[EmbeddingResult]) -> None:
            if all(w.answer.cancelled() for w in group):
                run.cancel()

        for waiting in group:
            waiting.answer.add_done_callback(left)
        try:
            result = await run
        except BaseException as error:  # the job failed (its worker died ...): each gets it
            for waiting in group:
                _give(waiting, error)
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and task and task.cancelling():
                raise  # the pod stops
            return
        if len(group) == 1:
            if not group[0].answer.done():
                group[0].answer.set_result(result)
            return
        offset = 0
        for waiting in group:
            n = len(waiting.job.inputs)
            items = [item.model_copy(update={"index": item.index - offset})
                     for item in result.items[offset:offset + n]]
            offset += n
            if not waiting.answer.done():
                _answer_one(waiting, EmbeddingResult(pooling=result.pooling, items=items))


def _take(waiting: list[_Waiting]) -> list[_Waiting]:
    """The longest run of waiting requests (at least one) within the bounds of one job."""
    group: list[_Waiting] = []
    inputs = chars = 0
    while waiting:
        job = waiting[0].job
        size = sum(len(i) if isinstance(i, str) else 0 for i in job.inputs)
        if group and (inputs + len(job.inputs) > MAX_INPUTS or chars + size > MAX_CHARS):
            break
        group.append(waiting.pop(0))
        inputs, chars = inputs + len(job.inputs), chars + size
    return group


def _answer_one(waiting: _Waiting, result: EmbeddingResult) -> None:
    """A request's share of a combined job: as its own job would have answered (the first
    failed input fails it, unless it asked for per-input errors)."""
    failed = next((item for item in result.items if item.error is not None), None)
    if failed is not None and not waiting.job.per_input_errors:
        assert failed.error is not None
        _fail(waiting, error_from_info(failed.error))
        return
    waiting.answer.set_result(result)


def _fail(waiting: _Waiting, error: LlamaqError) -> None:
    _give(waiting, error)


def _give(waiting: _Waiting, error: BaseException) -> None:
    """End a request's wait with `error` (a cancel as a cancel)."""
    if waiting.answer.done():
        return
    if isinstance(error, asyncio.CancelledError):
        waiting.answer.cancel()
    else:
        waiting.answer.set_exception(error)

