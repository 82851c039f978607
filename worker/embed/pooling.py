"""What an embedding or rerank job answers, from the rows its inputs' decodes gave: a pooled
embedding normalized as the request asks (llama.cpp's common_embd_normalize), a rerank score
raw, and every input's item in input order, failed ones (per_input_errors) with their error.

Pure: numpy only, no llama.cpp (the embedder reads the rows, worker/embed/embedder.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from scheduler.contract.errors import ErrorInfo
from scheduler.contract.jobs import EmbeddingJob, RerankJob
from scheduler.contract.results import (
    EmbeddingItem,
    EmbeddingResult,
    RerankItem,
    RerankResult,
    pack_floats,
)

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

Pooling = Literal["none", "mean", "cls", "last", "rank"]


def normalize(vector: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max absolute scaled to int16, 2 euclidean,
    any other p-norm (1 taxicab)."""
    import numpy as np

    values = vector.astype(np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = float(np.max(np.abs(values), initial=0.0)) / 32760.0
    elif norm == 2:
        total = float(np.sqrt(np.sum(values * values)))
    else:
        total = float(np.sum(np.abs(values) ** norm) ** (1.0 / norm))
    scale = np.float32(1.0 / total if total > 0.0 else 0.0)
    return (vector * scale).astype(np.float32)


def finished_rows(rows: np.ndarray, pooled: bool, job: EmbeddingJob | RerankJob,
                  norm: int) -> np.ndarray:
    """An input's rows as its answer keeps them: a pooled embedding normalized, a rerank's
    score and unpooled rows (one per token) as the decode gave them."""
    if pooled and isinstance(job, EmbeddingJob):
        return normalize(rows[0], norm)[None, :]
    return rows


def job_result(job: EmbeddingJob | RerankJob, pooling: Pooling, n_tokens: Mapping[int, int],
               rows: Mapping[int, np.ndarray],
               errors: Mapping[int, ErrorInfo]) -> EmbeddingResult | RerankResult:
    """Every input's item in input order. `n_tokens`: the inputs that ran, by index; `rows`:
    those that finished; `errors`: those that failed their checks."""
    if isinstance(job, RerankJob):
        scores = []
        for index in range(len(job.documents)):
            if index not in n_tokens or index not in rows:
                scores.append(RerankItem(index=index, score=-1e6, n_tokens=0,
                                         error=errors.get(index)))
                continue
            scores.append(RerankItem(index=index, score=float(rows[index][0][0]),
                                     n_tokens=n_tokens[index]))
        return RerankResult(items=scores)
    items = []
    for index in range(len(job.inputs)):
        if index not in n_tokens or index not in rows:
            items.append(EmbeddingItem(index=index, n_tokens=0, error=errors.get(index)))
            continue
        found = rows[index]
        items.append(EmbeddingItem(index=index, n_tokens=n_tokens[index],
                                   n_embd=found.shape[1], data=pack_floats(found.ravel())))
    return EmbeddingResult(pooling=pooling, items=items)
