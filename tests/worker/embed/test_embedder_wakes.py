"""The embedder's two decode threads are woken only when they have something to do
(worker/embed/embedder.py `_notify`), in-process on all-MiniLM-L6-v2: online requests one
after another leave the idle background thread asleep (a thread woken for nothing takes the GIL
and a context switch from the decode). Read from the kernel: the background thread's voluntary
context switches (each wake-up that finds nothing and sleeps again is one)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import EmbeddingInput, EmbeddingJob
from scheduler.contract.results import EmbeddingResult
from tests.worker.embed.running import running_embedder
from worker.embed.embedder import Embedder
from worker.embed.inputs import embedding_inputs
from worker.embed.queue import EmbedRequest

N_REQUESTS = 40

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


@pytest.fixture(scope="module")
def embedder(minilm_path: Path) -> Iterator[Embedder]:
    with running_embedder(minilm_path, n_ctx=512, n_slots=2) as embedder:
        yield embedder


def voluntary_switches(native_id: int | None) -> int:
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("voluntary_ctxt_switches"))


def embed(embedder: Embedder, text: str, background: bool = False) -> EmbeddingResult:
    job = EmbeddingJob(model="m", inputs=list[EmbeddingInput]([text]), background=background)
    result = embedder.submit(EmbedRequest(job, embedding_inputs(job, embedder.model), 2)
                             ).result(timeout=60)
    assert isinstance(result, EmbeddingResult)
    return result


def test_online_requests_leave_the_idle_background_thread_asleep(embedder: Embedder) -> None:
    embed(embedder, "a first sentence to warm up")
    background = embedder._threads[1]
    before = voluntary_switches(background.native_id)
    for i in range(N_REQUESTS):
        assert len(embed(embedder, f"sentence number {i} about the sea").items) == 1
    assert voluntary_switches(background.native_id) - before <= 2


def test_the_background_thread_still_wakes_for_background_work(embedder: Embedder) -> None:
    result = embed(embedder, "a batch line", background=True)
    assert len(result.items[0].vector()) == embedder.n_embd_out
    assert embed(embedder, "and an online one after it").items
