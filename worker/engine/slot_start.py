"""A slot made ready for a request's prompt: what of the prompt its KV cache keeps, and from where
the rest of a known prefix comes (plain state, on the engine thread). Every cache is keyed by
the request's cache salt (its tenant group under --tenants, scheduler/contract/jobs.py
`cache_salt`): a slot's KV, another slot's copy and the host cache's states serve only a
request of the salt they were made under.

In order: the slot's old prompt goes to the host-memory cache when the new one replaces it
(`--cache-ram`), the request's LoRA adapter set claims the slot (worker/adapters/adapter_sets.py), a
cached prompt that shares more comes back from the host cache, the slot's cache is cut to the common
prefix, shifted or restored from a context checkpoint (worker/kv/moves.py), then cut further where
the request needs it: an aLoRA's base prefix (worker/adapters/alora.py), a media chunk kept whole or
not at all (worker/runtime/media.py), and a fleet-wide KV tier hit that holds more
(worker/kv/tier.py).

Owns: that order, and `--cache-idle-slots` (idle slots' prompts into the host cache when a task
starts). Hands off: each move (kv_moves, prompt_cache, adapter_sets, snapshots).
"""

from __future__ import annotations

import logging

from scheduler.contract.errors import LlamaqError
from worker.adapters.adapter_sets import AdapterSets
from worker.engine.requests import Request
from worker.kv import moves as kv_moves
from worker.kv.checkpoints import CheckpointRules
from worker.kv.prompt_cache import PromptCache, wants_update
from worker.kv.slots import SlotCache
from worker.kv.snapshots import restore_slot
from worker.kv.tier import TierHit
from worker.runtime.media import MediaPrompt
from worker.runtime.model import LoadedModel

log = logging.getLogger(__name__)


class SlotStart:
    def __init__(self, model: LoadedModel, slots: list[SlotCache], kv: kv_moves.LlamaKv,
                 sets: AdapterSets, checkpoints: CheckpointRules,
                 prompt_cache: PromptCache | None) -> None:
        self.model = model
        self.slots = slots
        self.kv = kv
        self.sets = sets
        self.checkpoints = checkpoints
        self.prompt_cache = prompt_cache

    def first_set(self, request: Request) -> tuple[float, ...]:
        """The adapter scales the request's first tokens are decoded with."""
        return self.sets.first_set(request.job, request.adapter_set, request.alora)

    def prepare(self, request: Request, slot: SlotCache) -> int:
        """Make `slot` ready for the request; the number of prompt tokens its cache holds.
        A slot's KV made under another cache salt (another tenant group) is not reused: it
        goes to the host cache under its own salt, and the slot starts empty."""
        kv = self.kv
        salt = request.job.cache_salt
        cache = self.prompt_cache if request.cache_prompt else None
        foreign = slot.salt != salt and bool(slot.tokens)
        swap = cache is not None and (foreign or wants_update(slot.tokens,
                                                              request.prompt_tokens))
        if cache is not None and swap:  # what the slot loses goes to the host cache
            cache.save(kv, slot, self._tag(slot.slot_id, slot.salt))
        if foreign:
            kv_moves.clear(kv, slot)
        slot.salt = salt
        first_set = self.first_set(request)
        same_set = [s for s in self.sets.claim(kv, self.slots, slot, first_set)
                    if s.salt == salt]
        if cache is not None and swap:  # a cached prompt that shares more comes back
            cache.load(kv, kv, slot, request.prompt_tokens, (first_set, salt))
            cache.update()
        n_reuse = kv_moves.prepare_slot(kv, same_set, slot, request.prompt_tokens,
                                        request.cache_prompt, request.cache_reuse, kv,
                                        self.checkpoints)
        alora = request.alora
        if alora is not None and 0 < alora.pre_end < n_reuse:  # the base prefix only
            kv.remove(slot.slot_id, alora.pre_end, -1)
            del slot.tokens[alora.pre_end:]
            slot.checkpoints[:] = [c for c in slot.checkpoints if c.pos_max <= alora.pre_end]
            n_reuse = alora.pre_end
        if request.media is not None:
            n_reuse = self._reuse_whole_media(request.media, slot, n_reuse)
            if request.media.mrope:  # the cells past the kept prefix go by position
                kv.remove(slot.slot_id, request.media.pos_of(n_reuse), -1)
        if request.tier is not None and request.tier.hit is not None:
            restored = self._restore_tier(request.tier.hit, slot, n_reuse)
            request.tier.restored = restored > n_reuse
            n_reuse = restored
        log.debug("job %s: slot %d, %d prompt tokens, %d cached", request.job.job_id,
                  slot.slot_id, len(request.prompt_tokens), n_reuse)
        return n_reuse

    def cache_idle_slots(self) -> None:
        """--cache-idle-slots: a task started, so the idle slots' prompts go to the host cache.
        They stay in their slots too, also with a unified KV cache (where llama-server empties
        them): an idle slot is purged only when the cache has no room (the engine's decode),
        and until then it serves its prefix without a copy and keeps cache-aware routing's
        view."""
        cache = self.prompt_cache
        if cache is None:
            return
        for slot in self.slots:
            if not slot.busy and cache.save(self.kv, slot, self._tag(slot.slot_id, slot.salt)):
                cache.update()

    def _tag(self, slot_id: int, salt: str | None) -> tuple[object, ...]:
        """A host cache entry's key: the adapter set and the cache salt it was made under."""
        return (self.sets.set_of(slot_id), salt)

    def _restore_tier(self, hit: TierHit, slot: SlotCache, n_reuse: int) -> int:
        """A stored prefix state (worker/kv/tier.py) into the slot, when it holds more of
        the prompt than the slot's cache; one that does not restore is a miss."""
        if len(hit.tokens) <= n_reuse:
            return n_reuse
        try:
            restore_slot(self.model, slot, hit.data, hit.tokens)
        except LlamaqError as error:
            log.warning("kv tier: state of %d tokens not restored (%s)", len(hit.tokens), error)
            kv_moves.clear(self.kv, slot)
            return 0
        return len(hit.tokens)

    def _reuse_whole_media(self, media: MediaPrompt, slot: SlotCache, n_reuse: int) -> int:
        """A media chunk is cached whole or not at all: back off to its start."""
        span = media.span_over(n_reuse)
        if span is None:
            return n_reuse
        self.kv.remove(slot.slot_id, span.pos, -1)
        del slot.tokens[span.start:]
        slot.checkpoints[:] = [c for c in slot.checkpoints if c.pos_max <= span.start]
        return span.start
