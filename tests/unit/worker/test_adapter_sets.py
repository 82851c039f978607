"""worker/adapters/adapter_sets.py as plain state: a run's set, the step's group (sets in turns,
none starves), the prefix cache keyed by set. No llama.cpp call (nothing is applied here)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.contract.jobs import CompletionJob, LoraScale
from scheduler.registry import LoraAdapterInfo
from worker.adapters.adapter_sets import AdapterSets
from worker.kv.slots import SlotCache
from worker.runtime.lora import LoadedAdapter, LoraAdapters


class FakeKv:
    def __init__(self) -> None:
        self.removed: list[int] = []

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        self.removed.append(seq)
        return True

    def copy(self, src: int, dst: int) -> None: ...
    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None: ...
    def can_shift(self) -> bool:
        return True


@dataclass
class Run:
    slot: SlotCache


def adapters(n: int = 2) -> LoraAdapters:
    return LoraAdapters([LoadedAdapter(None, LoraAdapterInfo(id=i, path=f"a{i}", scale=1.0))
                         for i in range(n)], [1.0] * n)


def job(*scales: tuple[int, float]) -> CompletionJob:
    return CompletionJob(model="m", prompt="x",
                         lora=[LoraScale(id=i, scale=s) for i, s in scales] if scales else None)


def test_a_runs_set_is_its_lora_else_the_global_scales_at_its_start() -> None:
    sets = AdapterSets(adapters())
    assert sets.of(job()) == (1.0, 1.0)
    assert sets.of(job((1, 0.5), (9, 2.0))) == (0.0, 0.5)  # not named: 0; unknown: ignored


def test_the_sets_take_turns_step_by_step_and_none_starves() -> None:
    sets = AdapterSets(adapters())
    slots = [SlotCache(i) for i in range(4)]
    kv = FakeKv()
    for slot, j in zip(slots, [job((0, 1.0)), job((1, 1.0)), job((0, 1.0)), job()], strict=True):
        sets.claim(kv, slots, slot, sets.of(j))
    runs = [Run(s) for s in slots]
    picked = [sorted(r.slot.slot_id for r in sets.step_group(runs, False)) for _ in range(6)]
    assert picked[:3] == picked[3:]  # a fixed cycle of the three sets
    assert sorted(map(tuple, picked[:3])) == [(0, 2), (1,), (3,)]
    assert sets.step_group(runs[:1], False) == runs[:1]  # one set left: every step


def test_a_slots_cache_serves_only_its_own_set() -> None:
    sets = AdapterSets(adapters())
    slots = [SlotCache(0, tokens=[1, 2, 3]), SlotCache(1, tokens=[1, 2, 3])]
    kv = FakeKv()
    a, b = sets.of(job((0, 1.0))), sets.of(job((1, 1.0)))
    assert sets.claim(kv, slots, slots[0], a) == [slots[0]]  # unknown set: dropped
    assert kv.removed == [0] and slots[0].tokens == []
    slots[0].tokens[:] = [1, 2, 3]
    assert sets.usable(a, slots[0]) and not sets.usable(b, slots[0])
    sets.claim(kv, slots, slots[1], b)
    assert sets.claim(kv, slots, slots[0], a) == [slots[0]] and slots[0].tokens == [1, 2, 3]
    sets.forget(0)  # a restored snapshot: its set is unknown
    assert not sets.usable(a, slots[0])


def test_without_adapters_nothing_changes() -> None:
    sets = AdapterSets(LoraAdapters.none())
    slots = [SlotCache(0, tokens=[1]), SlotCache(1)]
    runs = [Run(s) for s in slots]
    assert sets.claim(FakeKv(), slots, slots[0], ()) is slots
    assert sets.step_group(runs, True) == runs and sets.decisions_turn()
    assert sets.usable(sets.of(job()), slots[0])
