"""Results in llama-server's native response shapes."""

from __future__ import annotations

from typing import Any

from scheduler.registry import ModelMeta
from scheduler.results import CompletionResult, TokenEvent

FINAL_ORDER = ("index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
               "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
               "stop_type", "stopping_word", "tokens_cached", "timings")


def completion_json(result: CompletionResult, index: int = 0,
                    slot_offset: int = 0) -> dict[str, Any]:
    data = result.model_dump(exclude={"result_kind", "worker_id"})
    data["index"] = index
    data["id_slot"] = result.id_slot + slot_offset
    data["stop"] = True
    return {key: data[key] for key in FINAL_ORDER}


def partial_json(event: TokenEvent, index: int | None = None) -> dict[str, Any]:
    """A streamed token: only content, tokens and stop (plus timings when asked for)."""
    data: dict[str, Any] = {"content": event.content, "tokens": event.tokens, "stop": False}
    if index is not None:
        data["index"] = index
    if event.timings is not None:
        data["timings"] = event.timings.model_dump()
    return data


def model_card(model_id: str, created: int, meta: ModelMeta | None,
               n_ctx: int | None) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "architecture": {
            "input_modalities": ["text"],
            "output_modalities": meta.output_modalities if meta else ["text"],
        },
        "meta": None if meta is None else {
            "vocab_type": meta.vocab_type,
            "n_vocab": meta.n_vocab,
            "n_ctx": n_ctx,
            "n_ctx_train": meta.n_ctx_train,
            "n_embd": meta.n_embd,
            "n_params": meta.n_params,
            "size": meta.size,
        },
    }
