"""An embedding or rerank job's answer from its rows (worker/embed/pooling.py) and what the
embedder's next decode takes (worker/embed/queue.py), without llama.cpp."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import EmbeddingJob, RerankJob
from scheduler.contract.results import EmbeddingResult, RerankResult, unpack_floats
from worker.embed.inputs import Prepared
from worker.embed.pooling import finished_rows, job_result, normalize
from worker.embed.queue import EmbedRequest, Sequence, take_step


def embedding_job(n_inputs: int) -> EmbeddingJob:
    return EmbeddingJob(job_id="e", model="m", inputs=[[1, 2]] * n_inputs)


def test_normalize_is_llama_cpp_s_every_norm() -> None:
    vector = np.array([3.0, -4.0], dtype=np.float32)
    assert normalize(vector, 2).tolist() == pytest.approx([0.6, -0.8])
    assert normalize(vector, -1).tolist() == [3.0, -4.0]
    assert normalize(vector, 1).tolist() == pytest.approx([3 / 7, -4 / 7])
    assert normalize(vector, 0).tolist() == pytest.approx([3 * 32760 / 4, -32760])
    assert normalize(np.zeros(3, dtype=np.float32), 2).tolist() == [0.0, 0.0, 0.0]
    assert normalize(vector, 2).dtype == np.float32


def test_pooled_embeddings_are_normalized_and_scores_and_token_rows_stay_raw() -> None:
    rows = np.array([[3.0, 4.0]], dtype=np.float32)
    assert finished_rows(rows, True, embedding_job(1), 2)[0].tolist() == \
        pytest.approx([0.6, 0.8])
    rerank = RerankJob(job_id="r", model="m", query="q", documents=["d"])
    assert finished_rows(rows, True, rerank, 2).tolist() == [[3.0, 4.0]]
    tokens = np.array([[3.0, 4.0], [6.0, 8.0]], dtype=np.float32)
    assert finished_rows(tokens, False, embedding_job(1), 2).tolist() == tokens.tolist()


def test_an_embedding_answer_has_every_input_in_order_failed_ones_with_their_error() -> None:
    error = InvalidRequest("input is too long").to_info()
    rows = {0: np.array([[1.0, 2.0]], dtype=np.float32),
            2: np.array([[3.0, 4.0], [5.0, 6.0]], dtype=np.float32)}
    result = job_result(embedding_job(3), "mean", {0: 4, 2: 7}, rows, {1: error})
    assert isinstance(result, EmbeddingResult) and result.pooling == "mean"
    assert [(i.index, i.n_tokens, i.n_embd, i.error) for i in result.items] == \
        [(0, 4, 2, None), (1, 0, 0, error), (2, 7, 2, None)]
    assert unpack_floats(result.items[2].data) == [3.0, 4.0, 5.0, 6.0]


def test_a_rerank_answer_scores_each_document_and_a_failed_one_lowest() -> None:
    job = RerankJob(job_id="r", model="m", query="q", documents=["d", "e"])
    result = job_result(job, "rank", {0: 5}, {0: np.array([[0.25]], dtype=np.float32)}, {})
    assert isinstance(result, RerankResult)
    assert [(i.index, i.score, i.n_tokens) for i in result.items] == [(0, 0.25, 5), (1, -1e6, 0)]


def sequences(*sizes: int) -> deque[Sequence]:
    request = EmbedRequest(embedding_job(len(sizes)), [], 2)
    return deque(Sequence(request, Prepared(i, [1] * size)) for i, size in enumerate(sizes))


def test_a_decode_takes_whole_sequences_in_order_while_they_fit() -> None:
    queue = sequences(3, 4, 2, 1)
    assert [s.input.index for s in take_step(queue, n_seq_max=8, n_batch=8)] == [0, 1]
    assert [s.input.index for s in queue] == [2, 3]
    assert [s.input.index for s in take_step(sequences(1, 1, 1), 2, 512)] == [0, 1]


def test_an_input_with_media_goes_alone() -> None:
    queue = sequences(2, 2, 2)
    queue[1].input.media = object()  # type: ignore[assignment]
    assert [s.input.index for s in take_step(queue, 8, 512)] == [0]
    assert [s.input.index for s in take_step(queue, 8, 512)] == [1]
    assert [s.input.index for s in take_step(queue, 8, 512)] == [2]
