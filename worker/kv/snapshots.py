"""A slot's KV state as bytes (llama_state_seq_get/set_data), so that a slot saved on one
machine can be restored on another through object storage.

Owns: the snapshot's bytes and its metadata (SnapshotMeta: the model it was saved from and the
tokens it holds), checked on restore; every restore failure is llama-server's 400 "Unable to
restore slot: …". save/restore/erase run on the engine thread, while the slot is idle.
"""

from __future__ import annotations

import ctypes
from array import array
from typing import Any

import llama_cpp as lc
from pydantic import ValidationError

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest, ServerError
from worker.kv.slots import SlotCache
from worker.runtime.model import LoadedModel


class SnapshotMeta(DeferredModel):
    """What is stored beside a snapshot's bytes."""

    model: str
    """The model id of the worker that saved it: a snapshot only restores on that model."""
    tokens: list[int]


def restore_error(detail: str) -> InvalidRequest:
    return InvalidRequest(f"Unable to restore slot: {detail}")


def check_snapshot(meta: dict[str, Any], model_id: str) -> SnapshotMeta:
    """The snapshot's metadata, if it is one of this model's."""
    try:
        snapshot = SnapshotMeta.model_validate(meta)
    except ValidationError:
        raise restore_error("invalid slot save file") from None
    if snapshot.model != model_id:
        raise restore_error(f"the file was saved from model {snapshot.model!r}, not "
                            f"{model_id!r}")
    return snapshot


def save_slot(model: LoadedModel, slot: SlotCache) -> tuple[bytes, list[int]]:
    if model.ctx is None:  # the simulator's model (worker/simulate/): its tokens are its state
        return array("i", slot.tokens).tobytes(), list(slot.tokens)
    size = lc.llama_state_seq_get_size(model.ctx, slot.slot_id)
    buffer = (ctypes.c_uint8 * size)()
    written = lc.llama_state_seq_get_data(model.ctx, buffer, size, slot.slot_id)
    if written == 0 and slot.tokens:
        raise ServerError("Unable to save slot")
    return bytes(buffer)[:written], list(slot.tokens)


def restore_slot(model: LoadedModel, slot: SlotCache, data: bytes, tokens: list[int]) -> int:
    if len(tokens) > model.n_ctx_slot:
        raise restore_error("Restored prompt does not fit in the slot context")
    if not all(model.vocab.valid(t) for t in tokens):
        raise restore_error("Invalid tokens in slot save file")
    if model.ctx is None:  # the simulator's model: the state is the tokens
        if data != array("i", tokens).tobytes():
            raise restore_error("invalid slot save file")
        slot.forget_tokens()
        slot.tokens.extend(tokens)
        return len(data)
    lc.llama_memory_seq_rm(model.memory, slot.slot_id, -1, -1)
    slot.forget_tokens()
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    read = lc.llama_state_seq_set_data(model.ctx, buffer, len(data), slot.slot_id)
    if read == 0:
        raise restore_error("No available space in KV cache or invalid slot save file")
    slot.tokens.extend(tokens)
    return int(read)


def erase_slot(model: LoadedModel, slot: SlotCache) -> int:
    erased = len(slot.tokens)
    if model.memory is not None:  # None: the simulator's model
        lc.llama_memory_seq_rm(model.memory, slot.slot_id, -1, -1)
    slot.forget_tokens()
    return erased
