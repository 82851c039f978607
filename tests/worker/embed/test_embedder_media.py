"""The embedder on inputs with media, in-process (no Redis, no api): Gemma 3 270M with the tiny
gemma3 projector on an embedding context with `--pooling none`, against what the vendored
llama-server answered (tests/data/llama_server_media_embeddings.json, `pooling_none`): one row
per token of the text after the last media chunk, as llama-server reads its last batch, close
to its rows; an input with media decoded between text inputs leaves them as they were alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scheduler.contract.jobs import EmbeddingInput, EmbeddingJob, MediaPromptInput
from scheduler.contract.media import MediaRef
from scheduler.contract.results import EmbeddingResult
from tests.media_embedding_cases import images
from tests.paths import DATA
from worker.embed.embedder import Embedder
from worker.embed.inputs import embedding_inputs
from worker.embed.queue import EmbedRequest
from worker.process.startup import tune_embedding_context
from worker.runtime.media import Projector, ProjectorOptions, media_marker
from worker.runtime.model import ContextPlan, LoadedModel
from worker.runtime.settings import WorkerSettings

RECORDED = json.loads((DATA /
                       "llama_server_media_embeddings.json").read_text())["pooling_none"]


@pytest.fixture(scope="module")
def embedder(gemma_path: Path, tiny_mmproj_path: Path) -> Iterator[Embedder]:
    plan = ContextPlan(n_ctx=2048, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                       n_threads=1, n_threads_batch=1, swa_full=False, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")
    settings = WorkerSettings(embedding=True, pooling="none")
    model = LoadedModel(gemma_path, plan,
                        tune_context=lambda p: tune_embedding_context(p, settings))
    assert model.model is not None
    model.projector = Projector(str(tiny_mmproj_path), model.model,
                                ProjectorOptions(offload=False, n_threads=1), media_marker({}))
    embedder = Embedder(model)
    embedder.start()
    yield embedder
    embedder.stop()
    model.close()


def embed(embedder: Embedder, inputs: list[EmbeddingInput]) -> EmbeddingResult:
    job = EmbeddingJob(model="m", inputs=inputs)
    media = {i: [images()["cat"]] for i, item in enumerate(inputs)
             if isinstance(item, MediaPromptInput)}
    prepared = embedding_inputs(job, embedder.model, media)
    assert all(item.error is None for item in prepared), [p.error for p in prepared]
    result = embedder.submit(EmbedRequest(job, prepared, 2)).result(timeout=120)
    assert isinstance(result, EmbeddingResult)
    return result


def rows(result: EmbeddingResult, index: int) -> np.ndarray:
    item = result.items[index]
    return np.array(item.rows())


def test_token_rows_are_llama_servers(embedder: Embedder) -> None:
    assert embedder.model.projector is not None
    marker = embedder.model.projector.marker
    image = MediaPromptInput(prompt=f"What is this: {marker}\nA small picture.",
                             media=[MediaRef.inline(images()["cat"])], marker=marker)
    result = embed(embedder, [image, "What is this: \n"])
    expected = [np.array(item["embedding"]) for item in RECORDED["rows"]["body"]]
    assert RECORDED["rows"]["status"] == 200
    for index in (0, 1):
        mine = rows(result, index)
        assert mine.shape == expected[index].shape  # (6, 640): the text after the image
        for got, want in zip(mine, expected[index], strict=True):
            cos = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
            assert cos > 0.99
    tokens = embedder.model.projector.tokenize(image.prompt, marker, [images()["cat"]],
                                               add_special=True).tokens
    assert result.items[0].n_tokens == len(tokens) > 16 + 6  # the image's 16 tokens count


def test_text_inputs_beside_media_are_as_alone(embedder: Embedder) -> None:
    assert embedder.model.projector is not None
    marker = embedder.model.projector.marker
    image = MediaPromptInput(prompt=f"A {marker} B", media=[MediaRef.inline(images()["cat"])],
                             marker=marker)
    alone = embed(embedder, ["first text", "second text"])
    mixed = embed(embedder, ["first text", image, "second text"])
    assert np.allclose(rows(alone, 0), rows(mixed, 0), atol=1e-4)
    assert np.allclose(rows(alone, 1), rows(mixed, 2), atol=1e-4)
    assert embedder.model.projector.n_decoded >= 1
