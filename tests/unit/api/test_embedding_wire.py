"""Reading embedding and rerank bodies as llama-server reads them
(api/endpoints/embeddings/protocol.py), and the embedder's normalization (llama.cpp's
common_embd_normalize)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from api.endpoints.embeddings.protocol import EmbeddingsRequest, RerankRequest, read_inputs
from scheduler.contract.errors import InvalidRequest


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


def embedding_request(body: dict[str, Any]) -> EmbeddingsRequest:
    return EmbeddingsRequest.model_validate(body)


def test_content_answers_natively_and_formats_are_checked() -> None:
    assert not embedding_request({"content": "x"}).answers_oai(oai_route=True)
    assert embedding_request({"input": "x"}).answers_oai(oai_route=True)
    assert not embedding_request({"input": "x"}).answers_oai(oai_route=False)
    assert embedding_request({"input": "x", "encoding_format": "base64"}).base64
    with pytest.raises(InvalidRequest, match="float or base64"):
        embedding_request({"input": "x", "encoding_format": "hex"})
    with pytest.raises(InvalidRequest, match="must not be empty"):
        embedding_request({"input": []})
    with pytest.raises(InvalidRequest, match="elements must be"):
        embedding_request({"input": [True]})


def test_content_beside_input_is_not_read() -> None:
    """llama-server reads `input` and ignores `content` then, whatever its shape (the body was
    once validated a second time, field by field, which refused such a `content`)."""
    request = embedding_request({"input": "a", "content": 2.5})
    assert request.inputs == ["a"] and request.answers_oai(oai_route=True)


def test_inputs_per_request_are_bounded() -> None:
    embedding_request({"input": ["x"] * 2048})
    with pytest.raises(InvalidRequest, match="Too many inputs: 2049"):
        embedding_request({"input": ["x"] * 2049})
    with pytest.raises(InvalidRequest, match="Too many documents: 2049"):
        RerankRequest.model_validate({"query": "q", "documents": ["x"] * 2049})


def test_rerank_defaults_and_tei() -> None:
    jina = RerankRequest.model_validate({"query": "q", "documents": ["a", "b"]})
    assert (jina.top_n, jina.tei, jina.return_text) == (2, False, False)
    tei = RerankRequest.model_validate({"query": "q", "texts": ["a"], "return_text": True,
                                        "top_n": "x"})
    assert (tei.documents, tei.top_n, tei.tei, tei.return_text) == (["a"], 1, True, True)
    both = RerankRequest.model_validate({"query": "q", "documents": ["a"], "texts": 5,
                                         "return_text": 1, "top_n": True, "model": 3})
    assert (both.documents, both.top_n, both.tei, both.return_text, both.model) == \
        (["a"], 1, True, False, 3)


@pytest.mark.parametrize(("body", "message"), [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 3, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [], "texts": ["a"]},
     '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2]}, '"documents" must be a non-empty string array'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a"], "top_n": -1}, '"top_n" must not be negative'),
])
def test_rerank_refuses_with_llama_servers_messages(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        RerankRequest.model_validate(body)
    assert str(refused.value) == message


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_normalize_is_llama_cpps(norm: int) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")  # the worker's side
    assert llama_cpp
    from worker.embed.pooling import normalize

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


EMBEDDING_BODIES = [
    {"input": "a"}, {"input": ["a", "b"]}, {"input": [1, 2, "x"]},
    {"input": [[1, 2], "a", {"content": [{"type": "text", "text": "hi"},
                                          {"type": "text", "text": 5}]}]},
    {"input": {"prompt_string": "a", "multimodal_data": 1}},
    {"input": [{"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                      "AAAA"}},
                            {"type": "text", "text": "x"}]}]},
    {"content": {"prompt_string": [1, "a"]}}, {"input": {"prompt_string": {"prompt_string": "x"}}},
    {"input": "a", "encoding_format": "base64", "embd_normalize": 2, "model": {"x": 1},
     "extra": 1, "dimensions": None},
    {"input": [{"content": []}]},
]
REFUSED_BODIES = [
    {"input": [True]}, {"input": None}, {"embd_normalize": True, "input": "a"},
    {"input": "a", "dimensions": 3}, {"input": []}, {"x": 1},
    {"input": 1.5}, {"input": [{"content": [{"text": "no type"}]}]},
    {"input": [{"content": [{"type": "image"}]}]}, {"input": [{"content": ["text"]}]},
    {"input": "a", "encoding_format": None},
]


@pytest.mark.parametrize("body", EMBEDDING_BODIES)
def test_the_model_reads_what_llama_server_reads(body: dict[str, Any]) -> None:
    request = EmbeddingsRequest.model_validate(body)
    assert request.inputs == read_inputs(body["input"] if "input" in body else body["content"])
    assert request.embd_normalize == body.get("embd_normalize")
    assert request.model == body.get("model")


@pytest.mark.parametrize("body", REFUSED_BODIES)
def test_the_model_refuses_with_llama_servers_messages(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        EmbeddingsRequest.model_validate(body)


def test_openapi_describes_the_embedding_bodies() -> None:
    from api.app import create_app
    from api.endpoints.openapi.api_router import openapi_document
    from api.settings import ApiSettings

    app = create_app(ApiSettings.from_args([], environ={}), "redis://127.0.0.1:1/0",
                     name="llamaq-openapi-test")
    document = openapi_document(app)
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == "#/components/schemas/EmbeddingsRequest"
    fields = document["components"]["schemas"]["EmbeddingsRequest"]["properties"]
    assert {"input", "content", "encoding_format", "embd_normalize"} <= set(fields)
