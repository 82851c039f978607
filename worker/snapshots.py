"""A slot's KV state as bytes (llama_state_seq_get/set_data), so that a slot saved on one
machine can be restored on another through object storage. These run on the engine thread,
while the slot is idle."""

from __future__ import annotations

import ctypes

import llama_cpp as lc

from scheduler.errors import InvalidRequest, ServerError
from worker.model import LoadedModel
from worker.slots import SlotCache


def save_slot(model: LoadedModel, slot: SlotCache) -> tuple[bytes, list[int]]:
    size = lc.llama_state_seq_get_size(model.ctx, slot.slot_id)
    buffer = (ctypes.c_uint8 * size)()
    written = lc.llama_state_seq_get_data(model.ctx, buffer, size, slot.slot_id)
    if written == 0 and slot.tokens:
        raise ServerError("Unable to save slot")
    return bytes(buffer)[:written], list(slot.tokens)


def restore_slot(model: LoadedModel, slot: SlotCache, data: bytes, tokens: list[int]) -> int:
    if len(tokens) > model.n_ctx_slot:
        raise InvalidRequest("Restored prompt does not fit in the slot context")
    if not all(model.vocab.valid(t) for t in tokens):
        raise InvalidRequest("Invalid tokens in slot save file")
    lc.llama_memory_seq_rm(model.memory, slot.slot_id, -1, -1)
    slot.tokens.clear()
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    read = lc.llama_state_seq_set_data(model.ctx, buffer, len(data), slot.slot_id)
    if read == 0:
        raise InvalidRequest("No available space in KV cache or invalid slot save file")
    slot.tokens.extend(tokens)
    return int(read)


def erase_slot(model: LoadedModel, slot: SlotCache) -> int:
    erased = len(slot.tokens)
    lc.llama_memory_seq_rm(model.memory, slot.slot_id, -1, -1)
    slot.tokens.clear()
    return erased
