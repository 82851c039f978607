"""Online embeddings before batch chunks, in-process on all-MiniLM-L6-v2 (no Redis, no api): an
online request that arrives while a decode of background sequences runs aborts that decode
(llama.cpp's abort callback) and is answered first; the background sequences run again, once,
and their embeddings are the ones a decode without interruption gives (up to float noise: their
decode mates differ)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from scheduler.contract.jobs import EmbeddingInput, EmbeddingJob
from scheduler.contract.results import EmbeddingResult, RerankResult
from tests.worker.embed.running import running_embedder
from worker.embed.embedder import Embedder
from worker.embed.inputs import embedding_inputs
from worker.embed.queue import EmbedRequest
from worker.runtime.compute_threads import BACKGROUND_NICE

N_SEQ = 8
LONG = " ".join(["a sentence about the sea and the mountains near the old city"] * 5)
"""~60 tokens: eight of them make a decode of a few hundred ms on one thread."""


@pytest.fixture(scope="module")
def embedder(minilm_path: Path) -> Iterator[Embedder]:
    with running_embedder(minilm_path, n_ctx=2048, n_slots=N_SEQ) as embedder:
        yield embedder


def submit(embedder: Embedder, texts: list[str], background: bool
           ) -> Future[EmbeddingResult | RerankResult]:
    job = EmbeddingJob(model="m", inputs=list[EmbeddingInput](texts),
                       background=background)
    return embedder.submit(EmbedRequest(job, embedding_inputs(job, embedder.model), 2))


def vectors(result: EmbeddingResult | RerankResult) -> list[np.ndarray]:
    assert isinstance(result, EmbeddingResult)
    return [np.array(item.vector()) for item in result.items]


def test_an_online_request_aborts_a_background_decode_and_goes_first(
        embedder: Embedder) -> None:
    texts = [f"{LONG} {i}" for i in range(N_SEQ)]
    undisturbed = vectors(submit(embedder, texts, background=True).result(timeout=60))
    yielded_before = embedder.n_decode_yielded

    background = submit(embedder, texts, background=True)
    deadline = time.monotonic() + 10
    while not embedder.yields_to_online() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert embedder.yields_to_online(), "the background decode never started"
    online = submit(embedder, ["an online query"], background=False)
    online.result(timeout=60)

    assert not background.done(), "the online request waited for the background decode"
    assert embedder.n_decode_yielded == yielded_before + 1
    again = vectors(background.result(timeout=60))
    for a, b in zip(again, undisturbed, strict=True):  # other decode mates: float noise only
        assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.99999


def test_a_background_decode_yields_only_once(embedder: Embedder) -> None:
    texts = [f"{LONG} {i}" for i in range(N_SEQ)]
    yielded_before = embedder.n_decode_yielded
    background = submit(embedder, texts, background=True)
    while not background.done():
        if embedder.yields_to_online():
            submit(embedder, ["an online query"], background=False).result(timeout=60)
        time.sleep(0.001)
    assert len(vectors(background.result())) == N_SEQ
    assert embedder.n_decode_yielded <= yielded_before + 1


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
def test_background_inputs_decode_at_a_lower_cpu_priority(embedder: Embedder) -> None:
    online, background = embedder._threads
    assert online.native_id is not None and background.native_id is not None
    base = os.getpriority(os.PRIO_PROCESS, online.native_id)
    assert os.getpriority(os.PRIO_PROCESS, background.native_id) == min(19, base + BACKGROUND_NICE)
