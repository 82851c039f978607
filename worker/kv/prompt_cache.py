"""The host-memory prompt cache (llama-server's `--cache-ram`, `--cache-idle-slots`): whole
states of prompts a slot is about to lose, kept in the worker's RAM, and put back into a slot
when a new prompt shares more of them than the slot's own cache does.

Owns: the cached states and llama-server's rules (server-task.cpp `server_prompt_cache`):
a state already contained in a cached one is not saved again, one that contains cached
ones replaces them, the oldest go first when the size limit is reached (insertion order,
not use), a hit moves the state out of the cache into the slot, and at most `n_ctx` tokens
are kept (more while their bytes fit the size limit), even at -1. Each state carries the
slot's context checkpoints and the LoRA adapter set it was made under (it only serves
prompts under the same set). The llama.cpp calls go through worker/kv/moves.py's SeqStates.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field

from worker.kv.checkpoints import Checkpoint
from worker.kv.moves import KvCache, SeqStates
from worker.kv.slots import SlotCache, common_prefix

log = logging.getLogger(__name__)

MIB = 1024 * 1024
KEEP_AT_LEAST = 0.25
"""A cached prompt is not loaded for a new one that keeps less than this share of it."""


@dataclass
class CachedPrompt:
    tokens: list[int]
    data: bytes
    checkpoints: list[Checkpoint] = field(default_factory=list)
    tag: Hashable = ()
    """The adapter set its KV was made under."""

    @property
    def size(self) -> int:
        return len(self.data) + sum(cp.size for cp in self.checkpoints)


def wants_update(cached: list[int], prompt: list[int]) -> bool:
    """Whether a slot that starts `prompt` goes through the cache: it is empty or about to
    lose more than half of what it holds (llama-server saves and loads when it picks a slot
    by least-recent use, or by similarity with f_keep < 0.5)."""
    return not cached or common_prefix(cached, prompt) < 0.5 * len(cached)


class PromptCache:
    """One engine's cache (the engine thread's alone)."""

    def __init__(self, limit_mib: int, limit_tokens: int) -> None:
        """`limit_mib`: --cache-ram (-1: no size limit; 0 is no cache: build none);
        `limit_tokens`: the context's size (0: no limit)."""
        self.limit_size = MIB * max(0, limit_mib)
        self.limit_tokens = limit_tokens
        self.states: list[CachedPrompt] = []
        self.hits = 0
        self.saves = 0

    def size(self) -> int:
        return sum(s.size for s in self.states)

    def clear(self) -> None:
        self.states.clear()

    def n_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.states)

    def save(self, states: SeqStates, slot: SlotCache, tag: Hashable = ()) -> bool:
        """Keep the slot's whole state (llama-server's prompt_save and alloc); False when it
        is empty, already held, or larger than the whole cache."""
        tokens = slot.tokens
        if not tokens:
            return False
        if any(s.tag == tag and common_prefix(s.tokens, tokens) == len(tokens)
               for s in self.states):
            return False  # already in the cache
        data = states.save(slot.slot_id, False)
        entry = CachedPrompt(list(tokens), data, list(slot.checkpoints), tag)
        if self.limit_size and entry.size > self.limit_size:
            log.warning("prompt state of %.3f MiB exceeds the cache limit of %.3f MiB: not "
                        "cached", entry.size / MIB, self.limit_size / MIB)
            return False
        self.states = [s for s in self.states  # those the new one contains
                       if not (s.tag == tag and common_prefix(s.tokens, tokens) == len(s.tokens))]
        if self.limit_size:
            while self.states and self.size() + entry.size > self.limit_size:
                self.states.pop(0)
        self.states.append(entry)
        self.saves += 1
        log.debug("prompt of %d tokens cached (%.3f MiB)", len(tokens), entry.size / MIB)
        return True

    def load(self, kv: KvCache, states: SeqStates, slot: SlotCache, prompt: list[int],
             tag: Hashable = ()) -> bool:
        """Put the cached state that shares the most of `prompt` into the slot, if it keeps
        more of its own length and shares more of the prompt than the slot's cache does
        (llama-server's load); the entry leaves the cache. False when none did or it could
        not be restored (the slot is then empty)."""
        n_own = common_prefix(slot.tokens, prompt)
        keep_best = n_own / len(slot.tokens) if slot.tokens else -1.0
        sim_best = n_own / max(1, len(prompt))
        best: CachedPrompt | None = None
        for entry in self.states:
            if entry.tag != tag:
                continue
            n = common_prefix(entry.tokens, prompt)
            keep, sim = n / len(entry.tokens), n / max(1, len(prompt))
            if keep < KEEP_AT_LEAST:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, entry
        if best is None:
            return False
        self.states.remove(best)
        kv.remove(slot.slot_id, -1, -1)
        slot.forget_tokens()
        if not states.load(slot.slot_id, best.data, partial=False):
            log.warning("slot %d: restoring a cached prompt of %d tokens failed", slot.slot_id,
                        len(best.tokens))
            kv.remove(slot.slot_id, -1, -1)
            return False
        slot.tokens.extend(best.tokens)
        slot.checkpoints.extend(best.checkpoints)
        self.hits += 1
        log.debug("slot %d: cached prompt of %d tokens restored", slot.slot_id, len(best.tokens))
        return True

    def update(self) -> None:
        """Hold the limits (llama-server's update): the size, then the tokens, where the
        token limit grows to what the size limit holds at the cache's bytes per token."""
        if self.limit_size:
            while self.states and self.size() > self.limit_size:
                self.states.pop(0)
        per_token = max(1.0, self.size() / max(1, self.n_tokens()))
        limit_tokens = max(self.limit_tokens, int(self.limit_size / per_token)) \
            if self.limit_size else self.limit_tokens
        if self.limit_tokens:
            while self.states and self.n_tokens() > limit_tokens:
                self.states.pop(0)
