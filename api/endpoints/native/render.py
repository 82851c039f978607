"""Results in llama-server's native response shapes."""

from __future__ import annotations

import math
import sys
from typing import Any

from scheduler.contract.results import CompletionResult, TokenEvent, TokenProbs
from scheduler.registry import ModelMeta

FINAL_ORDER = ("index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
               "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
               "stop_type", "stopping_word", "tokens_cached", "timings")


def completion_json(result: CompletionResult, index: int = 0, slot_offset: int = 0,
                    response_fields: list[str] | None = None) -> dict[str, Any]:
    data = result.model_dump(exclude={"result_kind", "worker_id", "probs",
                                      "post_sampling_probs"})
    data["index"] = index
    data["id_slot"] = result.id_slot + slot_offset
    data["generation_settings"] = result.generation_settings.to_wire(full=True)
    data["stop"] = True
    out = {key: data[key] for key in FINAL_ORDER}
    if result.probs:
        out["completion_probabilities"] = probs_json(result.probs, result.post_sampling_probs)
    return select_fields(out, response_fields) if response_fields else out


def select_fields(data: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """`response_fields`: keep the named fields; `a/b` takes `b` out of `a`, named `a/b`.
    Missing fields are left out without an error."""
    selected: dict[str, Any] = {}
    for path in paths:
        value: Any = data
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            selected[path] = value
    return selected


def probs_json(probs: list[TokenProbs], post_sampling: bool) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities entries."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def value(p: float) -> float:
        return p if post_sampling else _logprob(p)

    return [{"id": t.id, "token": t.token, "bytes": t.bytes, key: value(t.p),
             top_key: [{"id": c.id, "token": c.token, "bytes": c.bytes, key: value(c.p)}
                       for c in t.top]} for t in probs]


def _logprob(p: float) -> float:
    return math.log(p) if p > 0 else -sys.float_info.max


def partial_json(event: TokenEvent, index: int | None = None,
                 post_sampling: bool = False) -> dict[str, Any]:
    """A streamed token: only content, tokens and stop (plus timings, probabilities and
    prompt progress when asked for)."""
    data: dict[str, Any] = {"content": event.content, "tokens": event.tokens, "stop": False}
    if index is not None:
        data["index"] = index
    if event.timings is not None:
        data["timings"] = event.timings.model_dump()
    if event.probs:
        data["completion_probabilities"] = probs_json(event.probs, post_sampling)
    if event.progress is not None:
        data["prompt_progress"] = event.progress.model_dump()
    return data


def verbose_partial_json(event: TokenEvent, index: int,
                         post_sampling: bool = False) -> dict[str, Any]:
    """llama-server's native partial result, the `__verbose` object of a streamed chunk."""
    data: dict[str, Any] = {"index": index, "content": event.content, "tokens": event.tokens,
                            "stop": False, "id_slot": -1, "tokens_predicted": event.n_decoded,
                            "tokens_evaluated": event.n_prompt_tokens}
    return {**data, **{key: value for key, value in partial_json(event, None, post_sampling)
                       .items() if key not in data}}


def model_card(model_id: str, created: int, meta: ModelMeta | None,
               n_ctx: int | None, aliases: list[str] | None = None,
               tags: list[str] | None = None,
               offline_modalities: list[str] | None = None) -> dict[str, Any]:
    """A /v1/models item; `aliases` (every --alias) and `tags` (--tags) are listed sorted and
    without repeats, as llama-server keeps them (in a set). Without a live worker's `meta`,
    `offline_modalities` (read from the model file's header) are the output modalities."""
    return {
        "id": model_id,
        "aliases": sorted(set(aliases or [])),
        "tags": sorted(set(tags or [])),
        "object": "model",
        "created": created,
        "owned_by": "llamacpp",
        "architecture": {
            "input_modalities": input_modalities(meta),
            "output_modalities": meta.output_modalities if meta
            else offline_modalities or ["text"],
        },
        "meta": None if meta is None else {
            "vocab_type": meta.vocab_type,
            "n_vocab": meta.n_vocab,
            "n_ctx": n_ctx,
            "n_ctx_train": meta.n_ctx_train,
            "n_embd": meta.n_embd,
            "n_params": meta.n_params,
            "size": meta.size,
            "ftype": meta.model_ftype,
        },
    }


def input_modalities(meta: ModelMeta | None) -> list[str]:
    """"text", then what the model's projector takes ("image", "audio")."""
    modalities = {} if meta is None else meta.modalities
    return ["text"] + [name for key, name in (("vision", "image"), ("audio", "audio"))
                       if modalities.get(key)]


def ollama_model_json(model_id: str,
                      capabilities: list[str] | None = None) -> dict[str, Any]:
    """The `models` entry of /models (Ollama's list format, as llama-server fills it);
    `capabilities` as Ollama names them (completion, embedding; ours: rerank)."""
    return {
        "name": model_id, "model": model_id, "modified_at": "", "size": "", "digest": "",
        "type": "model", "description": "", "tags": [""],
        "capabilities": capabilities or ["completion"],
        "parameters": "",
        "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                    "parameter_size": "", "quantization_level": ""},
    }
