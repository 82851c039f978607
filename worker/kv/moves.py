"""The KV cache moves of the engine: what a slot's cache keeps when a run starts (prefix reuse,
another slot's prefix copied in, --cache-reuse shifts), the context shift of a full slot, and
the purge of an idle slot when a unified cache has no room.

Owns: applying those moves to the cache (through `KvCache`, llama.cpp's llama_memory_* calls)
and to the slots' token lists together. What to move is decided by plain functions of
worker/kv/slots.py (reusable_prefix, reuse_chunks); here it happens.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Protocol

import llama_cpp as lc

from worker.kv.checkpoints import Checkpoint, CheckpointRules
from worker.kv.slots import SHARE_MIN_TOKENS, SlotCache, reusable_prefix, reuse_chunks

log = logging.getLogger(__name__)


class KvCache(Protocol):
    """A llama.cpp memory, one sequence per slot (positions [p0, p1); -1: to the end)."""

    def remove(self, seq: int, p0: int, p1: int) -> bool: ...
    def copy(self, src: int, dst: int) -> None: ...
    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None: ...
    def can_shift(self) -> bool: ...


class SeqStates(Protocol):
    """A sequence's state as bytes (whole, or only the part that cannot be rolled back:
    `partial`) and its smallest and largest positions (-1: empty)."""

    def pos_min(self, seq: int) -> int: ...
    def pos_max(self, seq: int) -> int: ...
    def save(self, seq: int, partial: bool) -> bytes: ...
    def load(self, seq: int, data: bytes, partial: bool) -> bool: ...


class LlamaKv:
    """KvCache and SeqStates on a llama_context and its memory."""

    def __init__(self, memory: Any, ctx: Any = None) -> None:
        self._memory = memory
        self._ctx = ctx

    def pos_min(self, seq: int) -> int:
        return int(lc.llama_memory_seq_pos_min(self._memory, seq))

    def pos_max(self, seq: int) -> int:
        return int(lc.llama_memory_seq_pos_max(self._memory, seq))

    def save(self, seq: int, partial: bool) -> bytes:
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        size = lc.llama_state_seq_get_size_ext(self._ctx, seq, flags)
        buffer = (ctypes.c_uint8 * size)()
        written = lc.llama_state_seq_get_data_ext(self._ctx, buffer, size, seq, flags)
        return bytes(memoryview(buffer)[:written])

    def load(self, seq: int, data: bytes, partial: bool) -> bool:
        flags = lc.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else 0
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return bool(lc.llama_state_seq_set_data_ext(self._ctx, buffer, len(data), seq,
                                                    flags) == len(data))

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        return bool(lc.llama_memory_seq_rm(self._memory, seq, p0, p1))

    def copy(self, src: int, dst: int) -> None:
        lc.llama_memory_seq_cp(self._memory, src, dst, -1, -1)

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        lc.llama_memory_seq_add(self._memory, seq, p0, p1, delta)

    def can_shift(self) -> bool:
        return bool(lc.llama_memory_can_shift(self._memory))


def prepare_slot(kv: KvCache, slots: list[SlotCache], slot: SlotCache, prompt: list[int],
                 cache_prompt: bool, cache_reuse: int, states: SeqStates | None = None,
                 rules: CheckpointRules | None = None) -> int:
    """Make `slot`'s cache hold the longest start of `prompt` it can (its own prefix, a
    longer one copied from another slot, chunks shifted into place) and nothing after it;
    returns how many prompt tokens are cached. With `rules` that need checkpoints (an SWA
    or recurrent model), what the cache keeps is checked against what the next token
    attends to, and a checkpoint restored or the prompt processed again (restore_prefix)."""
    n_reuse = reusable_prefix(slot.tokens, prompt, cache_prompt)
    if cache_prompt:
        n_reuse = share_prefix(kv, slots, slot, prompt, n_reuse)
    if cache_reuse > 0 and cache_prompt:
        n_reuse = shift_chunks(kv, slot, prompt, n_reuse, cache_reuse)
    if states is not None and rules is not None and rules.needed:
        n_reuse = restore_prefix(states, slot, n_reuse, rules)
    if not kv.remove(slot.slot_id, n_reuse, -1):
        kv.remove(slot.slot_id, -1, -1)
        n_reuse = 0
    del slot.tokens[n_reuse:]
    CheckpointRules.invalidated(slot.checkpoints, n_reuse)
    return n_reuse


def restore_prefix(states: SeqStates, slot: SlotCache, n_past: int,
                   rules: CheckpointRules) -> int:
    """llama-server's check before a reused prefix: when the sequence no longer holds the
    cells the next position attends to (`pos_min >= n_past - n_swa`, or a recurrent state
    past it), restore the latest checkpoint that does, else keep nothing; returns how many
    tokens are kept."""
    if n_past <= 0:
        return n_past
    kept, checkpoint = rules.restore_point(slot.checkpoints, n_past, states.pos_min(slot.slot_id))
    if checkpoint is not None and not states.load(slot.slot_id, checkpoint.data, partial=True):
        log.warning("slot %d: restoring a context checkpoint failed", slot.slot_id)
        kept = 0
    if checkpoint is not None:
        log.debug("slot %d: context checkpoint restored (pos_min %d, pos_max %d, n_tokens %d)",
                  slot.slot_id, checkpoint.pos_min, checkpoint.pos_max, checkpoint.n_tokens)
    elif kept == 0:
        log.debug("slot %d: no checkpoint covers %d cached tokens: processing the prompt "
                  "again", slot.slot_id, n_past)
    return kept


def take_checkpoint(states: SeqStates, slot: SlotCache, rules: CheckpointRules,
                    n_tokens: int, task: int) -> Checkpoint | None:
    """Save the slot's partial state before its token `n_tokens` is decoded (the tokens of
    the step are not in the cache yet); None when the sequence is empty."""
    pos_min, pos_max = states.pos_min(slot.slot_id), states.pos_max(slot.slot_id)
    if pos_min < 0:
        return None
    checkpoint = Checkpoint(n_tokens, pos_min, pos_max, states.save(slot.slot_id, True), task)
    rules.add(slot.checkpoints, checkpoint)
    log.debug("slot %d: context checkpoint %d of %d (pos_min %d, pos_max %d, n_tokens %d, "
              "%.3f MiB)", slot.slot_id, len(slot.checkpoints), rules.n_max, pos_min, pos_max,
              n_tokens, checkpoint.size / 2**20)
    return checkpoint


def share_prefix(kv: KvCache, slots: list[SlotCache], slot: SlotCache, prompt: list[int],
                 n_reuse: int) -> int:
    """Copy another slot's cache when it holds more of the prompt than this slot does
    (worth it from SHARE_MIN_TOKENS more tokens); returns the new reusable length."""
    donors = [(reusable_prefix(s.tokens, prompt, True), s) for s in slots if s is not slot]
    n_shared, donor = max(donors, key=lambda d: d[0], default=(0, slot))
    if n_shared < n_reuse + SHARE_MIN_TOKENS:
        return n_reuse
    kv.remove(slot.slot_id, -1, -1)
    kv.copy(donor.slot_id, slot.slot_id)
    slot.tokens[:] = donor.tokens
    slot.checkpoints[:] = donor.checkpoints  # bytes are shared, never changed in place
    return n_shared


def shift_chunks(kv: KvCache, slot: SlotCache, prompt: list[int], n_past: int,
                 min_chunk: int) -> int:
    """Shift reusable chunks of the slot's cache to their place in the new prompt
    (llama-server's n_cache_reuse); returns how many prompt tokens are now cached."""
    if not kv.can_shift():
        return n_past
    seq = slot.slot_id
    for head_c, head_p, n in reuse_chunks(slot.tokens, prompt, n_past, min_chunk):
        kv.remove(seq, head_p, head_c)
        kv.shift(seq, head_c, head_c + n, head_p - head_c)
        slot.tokens[head_p : head_p + n] = prompt[head_p : head_p + n]
        n_past = head_p + n
    return n_past


def shift_context(kv: KvCache, slot: SlotCache, n_keep: int, n_discard: int,
                  n_ctx_slot: int) -> int | None:
    """--context-shift: keep the first `n_keep` tokens, drop `n_discard` of the rest (0: half),
    move the remainder back (llama-server's rule). Returns how many were dropped; None when
    the cache cannot shift."""
    if not kv.can_shift():
        return None
    tokens = slot.tokens
    n_keep = min(n_keep, n_ctx_slot - 4)
    n_left = len(tokens) - n_keep
    n_discard = max(0, min(n_discard or n_left // 2, n_left - 1))
    kv.remove(slot.slot_id, n_keep, n_keep + n_discard)
    kv.shift(slot.slot_id, n_keep + n_discard, len(tokens), -n_discard)
    del tokens[n_keep : n_keep + n_discard]
    slot.checkpoints.clear()  # their positions are gone
    return n_discard


def clear_idle_slot(kv: KvCache, slots: list[SlotCache]) -> bool:
    """Drop the cache of one idle slot to make room (llama-server's try_clear_idle_slots, for a
    unified cache); False when there is none to drop."""
    for slot in slots:
        if not slot.busy and slot.tokens:
            log.warning("purging slot %d with %d tokens", slot.slot_id, len(slot.tokens))
            kv.remove(slot.slot_id, -1, -1)
            slot.forget_tokens()
            return True
    return False


def clear(kv: KvCache, slot: SlotCache) -> None:
    """Empty the slot's cache (a failed decode)."""
    kv.remove(slot.slot_id, -1, -1)
    slot.forget_tokens()
