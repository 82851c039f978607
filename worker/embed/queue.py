"""What waits for the embedder: a job's inputs as sequences, and what the next decode takes of
a queue (pure: no llama.cpp; the embedder's threads hold the queues, worker/embed/embedder.py).

A decode takes sequences in arrival order while they fit, by the engine's rule for prompts that
go whole (worker/engine/admission.py `whole_prompts`): at most n_seq_max sequences and n_batch
tokens (an embedding worker's logical batch is its physical one, as llama-server forces it).
An input with media goes alone (its chunks decode in steps of their own, the engine's
media_chunks in worker/engine/prefill.py).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scheduler.contract.errors import ErrorInfo
from scheduler.contract.jobs import EmbeddingJob, RerankJob
from scheduler.contract.results import EmbeddingResult, RerankResult
from worker.embed.inputs import Prepared
from worker.engine.admission import whole_prompts

if TYPE_CHECKING:
    import numpy as np


@dataclass
class EmbedRequest:
    """A job's inputs on their way through the embedder; `future` gets the result."""

    job: EmbeddingJob | RerankJob
    inputs: list[Prepared]
    """The inputs to decode (tokens checked)."""
    normalize: int
    errors: dict[int, ErrorInfo] = field(default_factory=dict)
    """Inputs that failed their checks (a job with per_input_errors): index -> error."""
    future: Future[EmbeddingResult | RerankResult] = field(default_factory=Future)
    rows: dict[int, np.ndarray] = field(default_factory=dict)
    """Finished inputs: index -> the rows (pooled: one row) of float32."""
    left: int = 0
    settled: bool = False
    """Its answer is decided (worker/embed/outbox.py sets the future)."""

    @property
    def background(self) -> bool:
        return self.job.background


@dataclass
class Sequence:
    request: EmbedRequest
    input: Prepared
    yielded: bool = False
    """Its decode was aborted once for online work: the next one runs to the end."""


def take_step(queue: deque[Sequence], n_seq_max: int, n_batch: int) -> list[Sequence]:
    """The next decode's sequences, taken from the front of `queue`."""
    if queue and queue[0].input.media is not None:
        return [queue.popleft()]
    sizes = (n_batch + 1 if s.input.media is not None else len(s.input.tokens) for s in queue)
    return [queue.popleft() for _ in range(whole_prompts(sizes, n_seq_max, n_batch))]
