"""Embedding and rerank results in llama-server's shapes (server-common.cpp
format_embeddings_response_oaicompat and format_response_rerank, server-task.cpp
server_task_result_embd::to_json): keys in its (sorted) order."""

from __future__ import annotations

from typing import Any

from scheduler.contract.results import EmbeddingResult, RerankResult


def native_embeddings_json(result: EmbeddingResult) -> list[dict[str, Any]]:
    """/embedding: every input's rows (a pooled input is one row), unnormalized per token with
    pooling none."""
    return [{"embedding": item.rows(), "index": item.index} for item in result.items]


def oai_embeddings_json(result: EmbeddingResult, model: str,
                        base64: bool) -> dict[str, Any]:
    data = []
    for item in result.items:
        if base64:  # the float32 bytes, as they crossed Redis
            data.append({"embedding": item.data, "encoding_format": "base64",
                         "index": item.index, "object": "embedding"})
        else:
            data.append({"embedding": item.vector(), "index": item.index,
                         "object": "embedding"})
    n_tokens = result.n_tokens
    return {"data": data, "model": model, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def rerank_json(result: RerankResult, model: str, documents: list[str], top_n: int, tei: bool,
                return_text: bool) -> dict[str, Any] | list[dict[str, Any]]:
    """Jina's shape (`results` of index and relevance_score, with usage), or TEI's (a bare
    array of index and score, plus text with return_text); best first, at most top_n."""
    label = "score" if tei else "relevance_score"
    ranked = []
    for item in sorted(result.items, key=lambda i: i.score, reverse=True)[:top_n]:
        entry: dict[str, Any] = {"index": item.index, label: item.score}
        if return_text:
            entry["text"] = documents[item.index]
        ranked.append(entry)
    if tei:
        return ranked
    n_tokens = result.n_tokens
    return {"model": model, "object": "list",
            "results": ranked, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
