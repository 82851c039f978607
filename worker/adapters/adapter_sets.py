"""Per-request LoRA adapter sets in the engine: which scales a run decodes under, which runs a
step decodes together, and whose cache a run may reuse.

llama.cpp applies adapters to the whole context, so runs under different adapter sets cannot
share one llama_decode. Each step decodes one group, the runs of one adapter set, and the
groups take turns, one step each in a fixed order (no set starves: with k sets, each gets every
k-th step). The prefix cache is keyed by adapter set: a slot's KV made under one set is never
reused by a run under another (llama-server keys nothing: a prompt cached under adapter A
serves a request under B when that one carries no `lora`).

Owns: AdapterSet (one scale per loaded adapter), a request's set (its `lora`, else the global
scales when it starts), each slot's cache set, the step's group, and setting the group's
scales on the context before the decode. With no adapter loaded every set is the empty one and
nothing here changes what the engine does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from scheduler.contract.jobs import CompletionJob, scales_of
from worker.adapters.alora import ALoraRun
from worker.kv import moves as kv_moves
from worker.kv.slots import SlotCache
from worker.runtime.lora import LoraAdapters

AdapterSet = tuple[float, ...]  # as worker/adapters/alora.py


class GroupedRun(Protocol):
    """What grouping needs of a run (worker/engine/slot_run.py SlotRun)."""

    @property
    def slot(self) -> SlotCache: ...


R = TypeVar("R", bound=GroupedRun)


class AdapterSets:
    """One engine's adapter sets (the engine thread's alone, like its slots)."""

    def __init__(self, adapters: LoraAdapters) -> None:
        self._adapters = adapters
        self._cache_set: dict[int, AdapterSet] = {}
        """The set each slot's KV was made under (absent: unknown, never reused)."""
        self._last: AdapterSet | None = None
        """The set the previous step decoded."""

    @property
    def active(self) -> bool:
        return bool(self._adapters.adapters)

    def global_set(self) -> AdapterSet:
        return tuple(self._adapters.scales)

    def of(self, job: CompletionJob) -> AdapterSet:
        """The request's own `lora` (adapters not named at 0, unknown ids ignored), else the
        global scales as they are now (llama-server reads them when the slot starts)."""
        if job.lora is None:
            return self.global_set()
        return tuple(scales_of(len(self._adapters.adapters), job.lora))

    def claim(self, kv: kv_moves.KvCache, slots: list[SlotCache], slot: SlotCache,
              adapter_set: AdapterSet) -> list[SlotCache]:
        """`slot` starts a run under `adapter_set`: its cache goes if it was made under
        another set; returns the slots whose caches may be shared with it (the same set)."""
        if not self.active:
            return slots
        if self._cache_set.get(slot.slot_id) != adapter_set and slot.tokens:
            kv_moves.clear(kv, slot)
        self._cache_set[slot.slot_id] = adapter_set
        return [s for s in slots if self._cache_set.get(s.slot_id) == adapter_set]

    def first_set(self, job: CompletionJob, decided: AdapterSet | None,
                  alora: ALoraRun | None) -> AdapterSet:
        """The set a run's prompt starts under: the base for an aLoRA's tokens before its
        invocation (worker/adapters/alora.py), else its own (`decided` at prepare, else `of`)."""
        if alora is not None and alora.pre_end > 0:
            return alora.base
        return decided if decided is not None else self.of(job)

    def usable(self, adapter_set: AdapterSet, slot: SlotCache) -> bool:
        """May the slot's cache serve a prompt decoded under `adapter_set`?"""
        return not self.active or self._cache_set.get(slot.slot_id) == adapter_set

    def enter(self, slot: SlotCache, adapter_set: AdapterSet) -> None:
        """An aLoRA run reached its invocation: its slot decodes under its set from now."""
        self._cache_set[slot.slot_id] = adapter_set

    def end_alora(self, kv: kv_moves.KvCache, slot: SlotCache, alora: ALoraRun) -> None:
        """An aLoRA run ended: its slot keeps only the base prefix before the invocation."""
        if alora.pre_end <= 0:
            return
        if len(slot.tokens) > alora.pre_end:
            if not kv.remove(slot.slot_id, alora.pre_end, -1):
                kv_moves.clear(kv, slot)
            del slot.tokens[alora.pre_end:]
        self._cache_set[slot.slot_id] = alora.base

    def forget(self, slot_id: int) -> None:
        """The slot's cache was written by other means (a restored snapshot): its set is
        unknown, so no run reuses it."""
        self._cache_set.pop(slot_id, None)

    def set_of(self, slot_id: int) -> AdapterSet:
        return self._cache_set.get(slot_id, ())

    def step_group(self, runs: Sequence[R], decisions: bool) -> list[R]:
        """The runs this step decodes: those of the set whose turn it is, the next set after
        the last step's in a fixed order among the sets that have runs (`decisions`: decision
        runs wait for a step of the global set). Applies nothing yet."""
        if not self.active:
            self._last = ()
            return list(runs)
        sets = {self.set_of(r.slot.slot_id) for r in runs}
        if decisions:
            sets.add(self.global_set())
        if not sets:
            return []
        order = sorted(sets)
        after = [s for s in order if self._last is not None and s > self._last]
        chosen = after[0] if after else order[0]
        self._last = chosen
        return [r for r in runs if self.set_of(r.slot.slot_id) == chosen]

    def decisions_turn(self) -> bool:
        """Decision runs decode in this step (its set is the global one)."""
        return not self.active or self._last == self.global_set()

    def apply(self, ctx: Any) -> None:
        """The step's set on the context (before its decode)."""
        if self.active and self._last is not None:
            self._adapters.apply(ctx, list(self._last))
