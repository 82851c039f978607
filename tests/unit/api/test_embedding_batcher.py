"""The api's embedding batcher (api/embedding_batcher.py) as plain asyncio: a request alone
goes at once; requests that come while a job is out go together in the next one; each gets
its own items back; a bad input fails only its own request. `run` stands in for the job
client here (the fleet tests run it against real workers)."""

from __future__ import annotations

import asyncio

import pytest

from api.embedding_batcher import EmbeddingBatcher
from scheduler.contract.errors import InvalidRequest, Unavailable
from scheduler.contract.jobs import EmbeddingJob
from scheduler.contract.results import EmbeddingItem, EmbeddingResult


class Worker:
    """Answers each input with its length as n_tokens; an empty input fails (per input when
    the job asks for it, else the whole job, as the real worker does)."""

    def __init__(self) -> None:
        self.jobs: list[EmbeddingJob] = []
        self.release = asyncio.Event()
        self.fail_all: Exception | None = None

    async def run(self, job: EmbeddingJob) -> EmbeddingResult:
        self.jobs.append(job)
        await self.release.wait()
        if self.fail_all is not None:
            raise self.fail_all
        items = []
        for i, text in enumerate(job.inputs):
            assert isinstance(text, str)
            if not text:
                error = InvalidRequest("input is empty")
                if not job.per_input_errors:
                    raise error
                items.append(EmbeddingItem(index=i, n_tokens=0, error=error.to_info()))
            else:
                items.append(EmbeddingItem(index=i, n_tokens=len(text), n_embd=1, data=text))
        return EmbeddingResult(pooling="mean", items=items)


async def settled() -> None:
    """Let every task that can run, run (the batcher hands work between a few)."""
    for _ in range(10):
        await asyncio.sleep(0)


def job(*texts: str) -> EmbeddingJob:
    return EmbeddingJob(model="m", inputs=list(texts))


async def test_a_lone_request_goes_at_once_and_later_ones_go_together() -> None:
    worker = Worker()
    batcher = EmbeddingBatcher(worker.run)
    first = asyncio.create_task(batcher.embed(job("a")))
    await settled()
    assert [j.inputs for j in worker.jobs] == [["a"]]  # sent without waiting for anyone
    later = [asyncio.create_task(batcher.embed(job(*texts)))
             for texts in (("bb", "ccc"), ("dddd",), ("",))]
    await settled()
    assert len(worker.jobs) == 1  # they wait for the job in flight
    worker.release.set()
    assert [i.n_tokens for i in (await first).items] == [1]
    two, three = await later[0], await later[1]
    assert [(i.index, i.n_tokens) for i in two.items] == [(0, 2), (1, 3)]
    assert [(i.index, i.n_tokens) for i in three.items] == [(0, 4)]
    with pytest.raises(InvalidRequest, match="input is empty"):
        await later[2]  # its own bad input: only its own request fails
    assert [j.inputs for j in worker.jobs] == [["a"], ["bb", "ccc", "dddd", ""]]
    assert worker.jobs[1].per_input_errors


async def test_a_failed_combined_job_fails_each_of_its_requests() -> None:
    worker = Worker()
    batcher = EmbeddingBatcher(worker.run)
    first = asyncio.create_task(batcher.embed(job("a")))
    await settled()
    later = [asyncio.create_task(batcher.embed(job("b"))),
             asyncio.create_task(batcher.embed(job("c")))]
    await settled()
    worker.fail_all = Unavailable("the worker running this request stopped")
    worker.release.set()
    for task in (first, *later):
        with pytest.raises(Unavailable):
            await task


async def test_a_request_that_leaves_does_not_stop_the_others() -> None:
    worker = Worker()
    batcher = EmbeddingBatcher(worker.run)
    first = asyncio.create_task(batcher.embed(job("a")))
    await settled()
    leaving = asyncio.create_task(batcher.embed(job("b")))
    staying = asyncio.create_task(batcher.embed(job("cc")))
    await settled()
    leaving.cancel()
    worker.release.set()
    await first
    assert [i.n_tokens for i in (await staying).items] == [2]


async def test_off_sends_one_job_per_request() -> None:
    worker = Worker()
    worker.release.set()
    batcher = EmbeddingBatcher(worker.run, enabled=False)
    await asyncio.gather(batcher.embed(job("a")), batcher.embed(job("b")))
    assert [j.inputs for j in worker.jobs] == [["a"], ["b"]]


async def test_a_job_whose_requests_all_left_is_cancelled() -> None:
    """Clients that give up stop their job's decodes, as a request alone does."""
    worker = Worker()
    batcher = EmbeddingBatcher(worker.run)
    cancelled = asyncio.Event()
    real_run = worker.run

    async def run(job: EmbeddingJob) -> EmbeddingResult:
        try:
            return await real_run(job)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    batcher._run = run
    first = asyncio.create_task(batcher.embed(job("a")))
    await settled()
    first.cancel()
    await asyncio.wait_for(cancelled.wait(), 1)
    worker.release.set()
    assert [i.n_tokens for i in (await batcher.embed(job("bb"))).items] == [2]  # goes on
