"""Slot bookkeeping as plain state: which slot a request gets and how much cache it can reuse.

Owns: SlotCache (the tokens a slot's KV holds), the choice of slot for a prompt, the reusable
prefix and --cache-reuse chunks. No llama.cpp calls: the engine applies what these decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from worker.kv.checkpoints import Checkpoint


@dataclass
class SlotCache:
    """The tokens whose KV a slot (one llama sequence) currently holds."""

    slot_id: int
    tokens: list[int] = field(default_factory=list)
    last_used: float = 0.0
    busy: bool = False
    checkpoints: list[Checkpoint] = field(default_factory=list)
    """Its context checkpoints (worker/kv/checkpoints.py), oldest first; they cover a prefix of
    `tokens` and go when that prefix does."""
    salt: str | None = None
    """The cache salt (tenant group, CompletionJob.cache_salt) its KV was made under: only a
    request of the same salt reuses or copies it (None: no --tenants)."""

    def forget_tokens(self) -> None:
        """The cache was emptied: no tokens, no checkpoints."""
        self.tokens.clear()
        self.checkpoints.clear()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


SIMILARITY = 0.1
"""llama-server's default --slot-prompt-similarity: a slot's cache counts as a match for a prompt
only if their common prefix is more than this fraction of what the slot holds. Below it (a
chat template's first tokens, a shared greeting) the match saves next to nothing, and choosing
the slot for it would overwrite the same slot again and again while the others sit unused."""
SHARE_MIN_TOKENS = 16
"""The engine copies another slot's cache when it holds this many more prompt tokens."""


def pick_slot(slots: list[SlotCache], prompt: list[int], id_slot: int,
              beside_busy: bool = False, similarity: float = SIMILARITY,
              usable: Callable[[SlotCache], bool] = lambda _: True) -> SlotCache | None:
    """The requested slot if it is idle; else the idle slot whose cache matches the longest
    prefix of the prompt (llama-server's similarity rule). When no idle slot matches (or
    another slot, maybe busy, holds much more of the prompt: the engine copies that one), the
    slot to overwrite is one whose cache another slot holds too (a copy: nothing is lost), then
    (`beside_busy`) one next to a busy slot, else the least recently used. None when none is
    idle.

    `beside_busy` is for a KV cache that is not unified: llama.cpp then decodes only
    consecutive sequence ids in one ubatch, so busy slots 0, 1, 2, 7 cost two graph
    computations a step where 0, 1, 2, 3 cost one (llama-server's least-recently-used choice
    walks around the slots and leaves such gaps). `similarity` (-sps): 0 turns the prefix
    match off, as llama-server's 0.0 does.

    `usable`: whether a slot's cache may serve this prompt at all (made under the same LoRA
    adapter set, worker/adapters/adapter_sets.py); one that may not matches nothing."""
    if id_slot >= 0:
        slot = slots[id_slot]
        return None if slot.busy else slot
    idle = [s for s in slots if not s.busy]
    if not idle:
        return None
    shared = {s.slot_id: common_prefix(s.tokens, prompt) if usable(s) else 0 for s in slots}
    best = max(shared.values())

    def match(slot: SlotCache) -> int:
        n = shared[slot.slot_id]
        similar = similarity > 0 and n > similarity * len(slot.tokens)
        return n if n > 0 and similar and n + SHARE_MIN_TOKENS > best else 0

    def beside(slot: SlotCache) -> bool:
        return beside_busy and any(0 <= i < len(slots) and slots[i].busy
                                   for i in (slot.slot_id - 1, slot.slot_id + 1))

    held = held_elsewhere(slots)
    return max(idle, key=lambda s: (match(s), s.slot_id in held, beside(s), -s.last_used))


def held_elsewhere(slots: list[SlotCache]) -> set[int]:
    """The slots whose cache another slot's begins with at least 3/4 of (same system
    prompt). In the caches' sorted order the caches that begin with a given head are
    consecutive, so another holds a slot's head when a neighbour in that order does: one
    sort, not a comparison of every pair (issue 44: 3.2 ms a job at 128 slots)."""
    ordered = sorted(slots, key=lambda s: s.tokens)
    held = set()
    for i, slot in enumerate(ordered):
        if not slot.tokens:
            continue
        n = (3 * len(slot.tokens) + 3) // 4
        head = slot.tokens[:n]
        if any(0 <= j < len(ordered) and ordered[j].tokens[:n] == head for j in (i - 1, i + 1)):
            held.add(slot.slot_id)
    return held


def reusable_prefix(cached: list[int], prompt: list[int], cache_prompt: bool) -> int:
    """How many prompt tokens need no decode. At least one token is always decoded, since the
    last prompt token's logits are needed to sample."""
    if not cache_prompt:
        return 0
    return min(common_prefix(cached, prompt), len(prompt) - 1)


def reuse_chunks(cached: list[int], prompt: list[int], n_past: int,
                 min_chunk: int) -> list[tuple[int, int, int]]:
    """--cache-reuse: after the common prefix, chunks of at least `min_chunk` tokens of the
    cache that the prompt repeats further on, as (cache start, prompt start, length). Moving
    each chunk's KV to its prompt position (a shift) saves decoding it again. Chunks are in
    order and contiguous in the prompt from `n_past` on; the last prompt token is left out."""
    chunks = []
    head_c = head_p = n_past
    end_p = len(prompt) - 1
    while head_c < len(cached) and head_p < end_p:
        n = 0
        while (head_c + n < len(cached) and head_p + n < end_p
               and cached[head_c + n] == prompt[head_p + n]):
            n += 1
        if n >= min_chunk:
            chunks.append((head_c, head_p, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return chunks
