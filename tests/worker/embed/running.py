"""A started MiniLM embedder on one thread, for the embedder's in-process tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.embed.embedder import Embedder
from worker.process.startup import tune_embedding_context
from worker.runtime.model import ContextPlan, LoadedModel
from worker.runtime.settings import WorkerSettings


@contextmanager
def running_embedder(path: Path, n_ctx: int, n_slots: int) -> Iterator[Embedder]:
    plan = ContextPlan(n_ctx=n_ctx, n_slots=n_slots, kv_unified=False, n_batch=512,
                       n_ubatch=512, n_threads=1, n_threads_batch=1, swa_full=False,
                       flash_attn="auto", cache_type_k="f16", cache_type_v="f16")
    settings = WorkerSettings(embedding=True)
    model = LoadedModel(path, plan, tune_context=lambda p: tune_embedding_context(p, settings))
    embedder = Embedder(model)
    embedder.start()
    try:
        yield embedder
    finally:
        embedder.stop()
        model.close()
