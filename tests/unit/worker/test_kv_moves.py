"""The engine's KV moves (worker/kv/moves.py) on a simulated cache: after every move, what the
cache holds for a slot is what the slot's token list says it holds."""

from __future__ import annotations

import pytest

from worker.kv.moves import clear, clear_idle_slot, prepare_slot, shift_chunks, shift_context
from worker.kv.slots import SHARE_MIN_TOKENS, SlotCache

END = 1 << 30


class FakeKv:
    """Cells per sequence: position -> the token whose KV sits there."""

    def __init__(self, slots: list[SlotCache], shiftable: bool = True) -> None:
        self.cells = {s.slot_id: dict(enumerate(s.tokens)) for s in slots}
        self.shiftable = shiftable
        self.refuse_partial = False

    @staticmethod
    def _range(p0: int, p1: int) -> range:
        return range(max(p0, 0), END if p1 < 0 else p1)

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        if self.refuse_partial and p0 > 0:
            return False
        span = self._range(p0, p1)
        self.cells[seq] = {p: t for p, t in self.cells[seq].items() if p not in span}
        return True

    def copy(self, src: int, dst: int) -> None:
        self.cells[dst] = dict(self.cells[src])

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        span = self._range(p0, p1)
        self.cells[seq] = {(p + delta if p in span else p): t
                           for p, t in self.cells[seq].items()}

    def can_shift(self) -> bool:
        return self.shiftable

    def holds(self, slot: SlotCache) -> bool:
        return self.cells[slot.slot_id] == dict(enumerate(slot.tokens))


def slots(*token_lists: list[int]) -> list[SlotCache]:
    return [SlotCache(i, list(tokens)) for i, tokens in enumerate(token_lists)]


def test_a_run_keeps_its_slots_common_prefix_and_drops_the_rest() -> None:
    pool = slots(list(range(10)))
    kv = FakeKv(pool)
    prompt = [0, 1, 2, 3, 4, 99, 98]
    assert prepare_slot(kv, pool, pool[0], prompt, cache_prompt=True, cache_reuse=0) == 5
    assert pool[0].tokens == [0, 1, 2, 3, 4] and kv.holds(pool[0])


def test_without_cache_prompt_nothing_is_kept() -> None:
    pool = slots(list(range(10)))
    kv = FakeKv(pool)
    assert prepare_slot(kv, pool, pool[0], list(range(10)), False, 0) == 0
    assert pool[0].tokens == [] and kv.holds(pool[0])


def test_a_longer_prefix_of_another_slot_is_copied_in() -> None:
    long = list(range(100, 100 + 2 * SHARE_MIN_TOKENS))
    pool = slots([100, 101], long)
    kv = FakeKv(pool)
    prompt = [*long, 7]
    assert prepare_slot(kv, pool, pool[0], prompt, True, 0) == len(long)
    assert pool[0].tokens == long and kv.holds(pool[0]) and kv.holds(pool[1])


def test_a_few_more_tokens_elsewhere_are_not_worth_a_copy() -> None:
    pool = slots([1, 2, 3], [1, 2, 3, 4, 5])
    kv = FakeKv(pool)
    assert prepare_slot(kv, pool, pool[0], [1, 2, 3, 4, 5, 6], True, 0) == 3
    assert pool[0].tokens == [1, 2, 3] and kv.holds(pool[0])


def test_cache_reuse_shifts_a_repeated_chunk_into_place() -> None:
    chunk = list(range(50, 60))
    pool = slots([1, 2, 77, 78, *chunk])
    kv = FakeKv(pool)
    prompt = [1, 2, *chunk, 5]
    assert prepare_slot(kv, pool, pool[0], prompt, True, cache_reuse=4) == 2 + len(chunk)
    assert pool[0].tokens == [1, 2, *chunk] and kv.holds(pool[0])


def test_no_shift_on_a_cache_that_cannot_shift() -> None:
    pool = slots([1, 2, 77, *range(50, 60)])
    kv = FakeKv(pool, shiftable=False)
    assert shift_chunks(kv, pool[0], [1, 2, *range(50, 60), 5], 2, 4) == 2
    assert shift_context(kv, pool[0], 1, 0, 4096) is None


def test_a_cache_that_refuses_a_partial_removal_is_emptied() -> None:
    pool = slots(list(range(10)))
    kv = FakeKv(pool)
    kv.refuse_partial = True
    assert prepare_slot(kv, pool, pool[0], [0, 1, 2, 9], True, 0) == 0
    assert pool[0].tokens == [] and kv.holds(pool[0])


@pytest.mark.parametrize(("n_keep", "n_discard", "dropped"), [(10, 0, 45), (10, 5, 5), (0, 0, 50)])
def test_a_context_shift_keeps_the_head_and_moves_the_rest_back(
        n_keep: int, n_discard: int, dropped: int) -> None:
    pool = slots(list(range(100)))
    kv = FakeKv(pool)
    assert shift_context(kv, pool[0], n_keep, n_discard, 4096) == dropped
    assert pool[0].tokens == [*range(n_keep), *range(n_keep + dropped, 100)]
    assert kv.holds(pool[0])


def test_an_idle_slot_is_purged_for_room_and_a_busy_one_never() -> None:
    pool = slots([1, 2], [3, 4], [])
    pool[0].busy = True
    kv = FakeKv(pool)
    assert clear_idle_slot(kv, pool)
    assert pool[1].tokens == [] and kv.holds(pool[1]) and pool[0].tokens == [1, 2]
    assert not clear_idle_slot(kv, pool)
    clear(kv, pool[0])
    assert pool[0].tokens == [] and kv.holds(pool[0])
