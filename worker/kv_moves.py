"""The KV cache moves of the engine: what a slot's cache keeps when a run starts (prefix reuse,
another slot's prefix copied in, --cache-reuse shifts), the context shift of a full slot, and
the purge of an idle slot when a unified cache has no room.

Owns: applying those moves to the cache (through `KvCache`, llama.cpp's llama_memory_* calls)
and to the slots' token lists together. What to move is decided by plain functions of
worker/slots.py (reusable_prefix, reuse_chunks); here it happens.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import llama_cpp as lc

from worker.slots import SHARE_MIN_TOKENS, SlotCache, reusable_prefix, reuse_chunks

log = logging.getLogger(__name__)


class KvCache(Protocol):
    """A llama.cpp memory, one sequence per slot (positions [p0, p1); -1: to the end)."""

    def remove(self, seq: int, p0: int, p1: int) -> bool: ...
    def copy(self, src: int, dst: int) -> None: ...
    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None: ...
    def can_shift(self) -> bool: ...


class LlamaKv:
    """KvCache on a llama_context's memory."""

    def __init__(self, memory: Any) -> None:
        self._memory = memory

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        return bool(lc.llama_memory_seq_rm(self._memory, seq, p0, p1))

    def copy(self, src: int, dst: int) -> None:
        lc.llama_memory_seq_cp(self._memory, src, dst, -1, -1)

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        lc.llama_memory_seq_add(self._memory, seq, p0, p1, delta)

    def can_shift(self) -> bool:
        return bool(lc.llama_memory_can_shift(self._memory))


def prepare_slot(kv: KvCache, slots: list[SlotCache], slot: SlotCache, prompt: list[int],
                 cache_prompt: bool, cache_reuse: int) -> int:
    """Make `slot`'s cache hold the longest start of `prompt` it can (its own prefix, a
    longer one copied from another slot, chunks shifted into place) and nothing after it;
    returns how many prompt tokens are cached."""
    n_reuse = reusable_prefix(slot.tokens, prompt, cache_prompt)
    if cache_prompt:
        n_reuse = share_prefix(kv, slots, slot, prompt, n_reuse)
    if cache_reuse > 0 and cache_prompt:
        n_reuse = shift_chunks(kv, slot, prompt, n_reuse, cache_reuse)
    if not kv.remove(slot.slot_id, n_reuse, -1):
        kv.remove(slot.slot_id, -1, -1)
        n_reuse = 0
    del slot.tokens[n_reuse:]
    return n_reuse


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
    return n_discard


def clear_idle_slot(kv: KvCache, slots: list[SlotCache]) -> bool:
    """Drop the cache of one idle slot to make room (llama-server's try_clear_idle_slots, for a
    unified cache); False when there is none to drop."""
    for slot in slots:
        if not slot.busy and slot.tokens:
            log.warning("purging slot %d with %d tokens", slot.slot_id, len(slot.tokens))
            kv.remove(slot.slot_id, -1, -1)
            slot.tokens.clear()
            return True
    return False


def clear(kv: KvCache, slot: SlotCache) -> None:
    """Empty the slot's cache (a failed decode)."""
    kv.remove(slot.slot_id, -1, -1)
    slot.tokens.clear()
