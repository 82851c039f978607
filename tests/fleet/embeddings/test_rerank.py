"""Rerank on a real fleet (a worker started with --rerank) serving a tiny BERT cross-encoder
written by the test: its scores equal the ones llama.cpp gives for the same file through
llama-cpp-python's own API, one pair at a time; Jina's and TEI's shapes on every alias; the
spec's errors. Also a worker with --pooling none (token rows, and OpenAI's path refused)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp as lc
import numpy as np
import pytest

from tests.conftest import make_fleet
from tests.tiny_bert import write_tiny_rank_bert

QUERY = "what is a panda?"
DOCUMENTS = ["hi", "it is a bear",
             "the giant panda (ailuropoda melanoleuca), sometimes called a panda bear or "
             "simply panda, is a bear species endemic to china.",
             "a red car is fast on the road", "pandas eat bamboo", "it lives in china"]
ALIASES = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


@pytest.fixture(scope="module")
def rank_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_rank_bert(tmp_path_factory.mktemp("rank") / "tiny-rank.gguf")


@pytest.fixture(scope="module")
def fleets(redis_url: str, workdir: Path, rank_model: Path,
           minilm_path: Path) -> Iterator[dict[str, str]]:
    """The module's two fleets, started at once (their loads overlap): `rank`, the tiny
    cross-encoder with --rerank and -fa off (the attention kernel of the reference context
    below: flash attention's rounding differs by ~1e-3 on these scores), and `none`, MiniLM
    with --pooling none."""
    rank = make_fleet(redis_url, workdir, rank_model, "tiny-rank")
    none = make_fleet(redis_url, workdir, minilm_path, "minilm-none")
    try:
        rank.add_worker("--rerank", "-np", "4", "-t", "1", "-fa", "off")
        none.add_worker("--embedding", "--pooling", "none", "-np", "2", "-t", "1")
        urls = {"rank": rank.add_api(), "none": none.add_api()}
        rank.wait_healthy(urls["rank"])
        none.wait_healthy(urls["none"])
        yield urls
    finally:
        rank.stop()
        none.stop()


@pytest.fixture(scope="module")
def rank_api(fleets: dict[str, str]) -> str:
    return fleets["rank"]


def llama_cpp_scores(path: Path, query: str, documents: list[str]) -> list[float]:
    """llama.cpp's own scores: each (query, document) pair as format_prompt_rerank builds it
    for this vocabulary ([CLS] query [SEP] [SEP] document [SEP]), decoded alone."""
    llm = lc.Llama(str(path), embedding=True, pooling_type=lc.LLAMA_POOLING_TYPE_RANK,
                   n_ctx=128, flash_attn=False, verbose=False)
    vocab = llm._model.vocab
    bos, sep, eos = lc.llama_vocab_bos(vocab), lc.llama_vocab_sep(vocab), lc.llama_vocab_eos(vocab)
    assert (lc.llama_vocab_get_add_bos(vocab), lc.llama_vocab_get_add_eos(vocab),
            lc.llama_vocab_get_add_sep(vocab)) == (True, True, True)
    scores = []
    for document in documents:
        tokens = [bos, *llm.tokenize(query.encode(), add_bos=False, special=False), eos, sep,
                  *llm.tokenize(document.encode(), add_bos=False, special=False), eos]
        array = (lc.llama_token * len(tokens))(*tokens)
        assert lc.llama_decode(llm._ctx.ctx, lc.llama_batch_get_one(array, len(tokens))) == 0
        scores.append(float(lc.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0]))
    llm.close()
    return scores


def test_scores_equal_llama_cpps_own_in_the_same_order(rank_api: str, rank_model: Path) -> None:
    expected = llama_cpp_scores(rank_model, QUERY, DOCUMENTS)
    assert len(set(expected)) == len(expected)
    body = {"model": "some-model", "query": QUERY, "documents": DOCUMENTS}
    response = httpx.post(f"{rank_api}/v1/rerank", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "some-model" and answer["object"] == "list"
    results = answer["results"]
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert [r["index"] for r in results] == order
    assert np.allclose([r["relevance_score"] for r in results], [expected[i] for i in order],
                       atol=1e-4, rtol=0)
    assert set(results[0]) == {"index", "relevance_score"}
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("path", ALIASES)
def test_every_alias_and_top_n(rank_api: str, path: str) -> None:
    body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    answer = httpx.post(f"{rank_api}{path}", json=body, timeout=60).json()
    scores = [r["relevance_score"] for r in answer["results"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_tei_shape_is_chosen_by_texts(rank_api: str) -> None:
    jina = httpx.post(f"{rank_api}/rerank", json={"query": QUERY, "documents": DOCUMENTS}
                      ).json()["results"]
    tei = httpx.post(f"{rank_api}/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
    assert isinstance(tei, list)
    assert [(r["index"], r["score"]) for r in tei] == \
        [(r["index"], r["relevance_score"]) for r in jina]
    assert all(set(r) == {"index", "score"} for r in tei)
    with_text = httpx.post(f"{rank_api}/v1/reranking",
                           json={"query": QUERY, "texts": DOCUMENTS, "return_text": True,
                                 "top_n": 2}).json()
    assert [r["text"] for r in with_text] == [DOCUMENTS[r["index"]] for r in tei[:2]]


@pytest.mark.parametrize(("body", "message"), [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 3, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2]}, '"documents" must be a non-empty string array'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a"], "top_n": -1}, '"top_n" must not be negative'),
])
def test_bad_bodies_are_400(rank_api: str, body: dict, message: str) -> None:
    response = httpx.post(f"{rank_api}/rerank", json=body)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": 400, "message": message,
                                        "type": "invalid_request_error"}


def test_a_rank_model_says_it_reranks(rank_api: str) -> None:
    props = httpx.get(f"{rank_api}/props").json()
    assert props["capabilities"] == ["embedding", "rerank"] and props["pooling"] == "rank"
    completion = httpx.post(f"{rank_api}/completion", json={"prompt": "hi"})
    assert completion.status_code == 501


@pytest.fixture(scope="module")
def none_api(fleets: dict[str, str]) -> str:
    return fleets["none"]


def test_pooling_none_gives_one_unnormalized_row_per_token(none_api: str) -> None:
    tokens = httpx.post(f"{none_api}/tokenize", json={"content": "hello world",
                                                      "add_special": True}).json()["tokens"]
    answer = httpx.post(f"{none_api}/embedding",
                        json={"content": ["hello world", "hi"], "embd_normalize": 2}).json()
    rows = answer[0]["embedding"]
    assert len(rows) == len(tokens) == 4 and all(len(r) == 384 for r in rows)
    assert all(abs(np.linalg.norm(r) - 1.0) > 0.1 for r in rows)  # never normalized
    assert answer[1]["index"] == 1 and len(answer[1]["embedding"]) == 3


def test_pooling_none_is_not_openai_compatible(none_api: str) -> None:
    response = httpx.post(f"{none_api}/v1/embeddings", json={"input": "hello"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": 400, "type": "invalid_request_error",
        "message": "Pooling type 'none' is not OAI compatible. Please use a different pooling "
                   "type"}


def test_a_rank_worker_embeds_too(rank_api: str) -> None:
    """--rerank implies --embedding (llama-server): the pooled output is the classifier's,
    normalized like any pooled embedding."""
    response = httpx.post(f"{rank_api}/v1/embeddings", json={"input": ["hi", "a bear"]})
    assert response.status_code == 200, response.text
    vectors = [d["embedding"] for d in response.json()["data"]]
    assert [len(v) for v in vectors] == [1, 1]
    assert all(abs(abs(v[0]) - 1.0) < 1e-6 for v in vectors)
