"""Reading embedding and rerank bodies as llama-server reads them
(api/endpoints/embeddings/protocol.py), and the embedder's normalization (llama.cpp's
common_embd_normalize)."""

from __future__ import annotations

import numpy as np
import pytest

from api.endpoints.embeddings.protocol import embedding_request, read_inputs, rerank_request
from scheduler.errors import InvalidRequest


@pytest.mark.parametrize(("prompt", "inputs"), [
    ("hi", ["hi"]),
    (["a", "b"], ["a", "b"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
    ([1, "a", 2], [[1, "a", 2]]),
    (["a", [1, 2]], ["a", [1, 2]]),
    ([{"prompt_string": "x"}], ["x"]),
    ([{"content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}], ["xy"]),
    ([], []),
])
def test_input_shapes(prompt: object, inputs: list[object]) -> None:
    assert read_inputs(prompt) == inputs


def test_content_answers_natively_and_formats_are_checked() -> None:
    assert not embedding_request({"content": "x"}, oai_route=True).oai
    assert embedding_request({"input": "x", "encoding_format": "base64"}, True).base64
    with pytest.raises(InvalidRequest, match="float or base64"):
        embedding_request({"input": "x", "encoding_format": "hex"}, True)
    with pytest.raises(InvalidRequest, match="must not be empty"):
        embedding_request({"input": []}, True)
    with pytest.raises(InvalidRequest, match="elements must be"):
        embedding_request({"input": [True]}, True)


def test_inputs_per_request_are_bounded() -> None:
    embedding_request({"input": ["x"] * 2048}, True)
    with pytest.raises(InvalidRequest, match="Too many inputs: 2049"):
        embedding_request({"input": ["x"] * 2049}, True)
    with pytest.raises(InvalidRequest, match="Too many documents: 2049"):
        rerank_request({"query": "q", "documents": ["x"] * 2049})


def test_rerank_defaults_and_tei() -> None:
    jina = rerank_request({"query": "q", "documents": ["a", "b"]})
    assert (jina.top_n, jina.tei, jina.return_text) == (2, False, False)
    tei = rerank_request({"query": "q", "texts": ["a"], "return_text": True, "top_n": "x"})
    assert (tei.documents, tei.top_n, tei.tei, tei.return_text) == (["a"], 1, True, True)


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_normalize_is_llama_cpps(norm: int) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")  # the worker's side
    assert llama_cpp
    from worker.embedder import normalize

    vector = np.array([3.0, -4.0, 0.5], dtype=np.float32)
    got = normalize(vector, norm)
    values = vector.astype(np.float64)
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = np.max(np.abs(values)) / 32760.0
    else:  # 2 is euclidean, the p-norm with p = 2
        total = np.sum(np.abs(values) ** norm) ** (1 / norm)
    assert got.dtype == np.float32
    assert np.allclose(got, values / total, rtol=1e-6)
