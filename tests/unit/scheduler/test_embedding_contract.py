"""The embedding and rerank job contract (scheduler/contract/jobs.py and results.py)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from scheduler.contract import keys
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import EmbeddingJob, JobKind, RerankJob, parse_job
from scheduler.contract.kinds import movable, queue_for
from scheduler.contract.results import (
    RESULT,
    EmbeddingItem,
    EmbeddingResult,
    RerankItem,
    RerankResult,
    pack_floats,
    unpack_floats,
)


def test_embedding_jobs_carry_many_inputs_of_every_prompt_shape() -> None:
    job = EmbeddingJob(model="m", inputs=["hello", [1, 2, 3], [4, "mixed", 5]],
                       embd_normalize=-1)
    payload = json.loads(json.dumps(job.model_dump(mode="json")))
    parsed = parse_job(payload, JobKind.EMBEDDING)
    assert parsed == job and parsed.kind is JobKind.EMBEDDING


def test_an_embedding_job_without_inputs_is_malformed() -> None:
    with pytest.raises(InvalidRequest, match="inputs"):
        parse_job({"kind": "embedding", "model": "m", "inputs": []}, JobKind.EMBEDDING)
    with pytest.raises(InvalidRequest, match="documents"):
        parse_job({"kind": "rerank", "model": "m", "query": "q", "documents": []},
                  JobKind.RERANK)


def test_a_rerank_job_round_trips() -> None:
    job = RerankJob(model="m", query="q", documents=["a", "b"], per_input_errors=True)
    assert parse_job(job.model_dump(mode="json"), JobKind.RERANK) == job


def test_queues_online_and_background_apart() -> None:
    assert queue_for(EmbeddingJob(model="m", inputs=["x"])) == keys.embed_queue("m")
    assert queue_for(RerankJob(model="m", query="q", documents=["d"])) == keys.embed_queue("m")
    assert queue_for(EmbeddingJob(model="m", inputs=["x"], background=True)) == \
        keys.embed_background_queue("m")


def test_embeddings_may_run_again_elsewhere() -> None:
    assert movable("embedding", None) and movable("rerank", None)


def test_packed_floats_are_float32_little_endian_as_openai_base64() -> None:
    values = [0.1, -2.5, 3.0]
    packed = pack_floats(values)
    assert base64.b64decode(packed) == struct.pack("<3f", *values)
    assert unpack_floats(packed) == [struct.unpack("<f", struct.pack("<f", v))[0]
                                     for v in values]


def test_a_float32_buffer_packs_as_its_values_do_and_any_other_array_by_value() -> None:
    import numpy as np

    values = [0.1, -2.5, 3.0, 7.25]
    row = np.array(values, dtype=np.float32)
    assert pack_floats(row) == pack_floats(values)  # taken as a buffer
    assert pack_floats(row.astype(np.float64)) == pack_floats(values)  # not float32: by value
    assert pack_floats(row[::2]) == pack_floats(values[::2])  # not contiguous: by value
    assert pack_floats(np.zeros(0, dtype=np.float32)) == ""


def test_results_round_trip_by_kind() -> None:
    item = EmbeddingItem(index=0, n_tokens=3, n_embd=2, data=pack_floats([1, 2, 3, 4]))
    result = EmbeddingResult(pooling="none", items=[item])
    back = RESULT.validate_json(json.dumps(result.model_dump(mode="json")))
    assert isinstance(back, EmbeddingResult) and back.items[0].rows() == [[1, 2], [3, 4]]
    assert back.n_tokens == 3
    rerank = RerankResult(items=[RerankItem(index=0, score=0.5, n_tokens=7)])
    assert RESULT.validate_python(rerank.model_dump()) == rerank
