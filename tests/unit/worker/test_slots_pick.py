"""Slot choice and prompt-cache reuse as plain state."""

from __future__ import annotations

import random

import pytest

from worker.kv.slots import SlotCache, common_prefix, held_elsewhere, pick_slot, reusable_prefix


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([], [1, 2], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 9, 3], 1),
        ([5, 2, 3], [1, 2, 3], 0),
    ],
)
def test_common_prefix(a: list[int], b: list[int], expected: int) -> None:
    assert common_prefix(a, b) == expected
    assert common_prefix(b, a) == expected


def slots(*caches: list[int], busy: tuple[int, ...] = (),
          last_used: tuple[float, ...] = ()) -> list[SlotCache]:
    used = last_used or tuple(0.0 for _ in caches)
    return [SlotCache(slot_id=i, tokens=list(t), last_used=used[i], busy=i in busy)
            for i, t in enumerate(caches)]


def test_requested_slot_is_given_when_idle() -> None:
    pool = slots([1, 2, 3], [9])
    assert pick_slot(pool, [1, 2, 3], id_slot=1) is pool[1]


def test_requested_slot_busy_gives_none_even_if_others_are_idle() -> None:
    pool = slots([1, 2, 3], [9], busy=(1,))
    assert pick_slot(pool, [1, 2, 3], id_slot=1) is None


def test_longest_common_prefix_wins() -> None:
    pool = slots([1, 9], [1, 2, 3, 9], [1, 2, 9], last_used=(0.0, 5.0, 1.0))
    assert pick_slot(pool, [1, 2, 3, 4], id_slot=-1) is pool[1]


def test_busy_slot_is_skipped_despite_longer_prefix() -> None:
    pool = slots([1, 2, 3], [1], busy=(0,))
    assert pick_slot(pool, [1, 2, 3], id_slot=-1) is pool[1]


def test_ties_go_to_the_least_recently_used() -> None:
    pool = slots([1, 2], [1, 2], [1, 2], last_used=(30.0, 10.0, 20.0))
    assert pick_slot(pool, [1, 2, 7], id_slot=-1) is pool[1]


def test_no_match_anywhere_picks_least_recently_used() -> None:
    pool = slots([], [4], [5], last_used=(3.0, 1.0, 2.0))
    assert pick_slot(pool, [1, 2], id_slot=-1) is pool[1]


def test_a_copy_is_overwritten_before_a_cache_held_nowhere_else() -> None:
    """Slot 0 (busy) holds the prompt's system prompt; slots 1 and 2 hold it too (copies),
    slot 3 another one: the new request takes a copy, not the least recently used slot 3,
    and the engine copies the busy slot's cache into it."""
    system, other = list(range(100, 140)), list(range(200, 240))
    pool = slots([*system, 1, 2], [*system, 3, 4], [*system, 5], [*other, 6],
                 busy=(0,), last_used=(0.0, 5.0, 6.0, 1.0))
    assert pick_slot(pool, [*system, 7, 8], id_slot=-1) is pool[1]
    third = list(range(300, 340))
    pool = slots([*system, 1, 2], [*other, 3], [*system, 5], [*third, 6, 7],
                 busy=(0,), last_used=(0.0, 5.0, 6.0, 1.0))
    assert pick_slot(pool, [9, *system], id_slot=-1) is pool[2]  # a cold prompt: a copy too


def test_an_idle_slot_holding_the_prompt_beats_copies() -> None:
    system = list(range(100, 140))
    pool = slots([*system, 1], [*system, 2], [*system[:20], 3], busy=(0,),
                 last_used=(0.0, 9.0, 1.0))
    assert pick_slot(pool, [*system, 7], id_slot=-1) is pool[1]


def test_prompts_sharing_only_a_short_header_spread_over_the_slots() -> None:
    """Four system prompts that begin with the same 3 tokens (a template's header), each 40
    tokens long: a new one must not overwrite the slot of the last one for those 3 tokens (the
    worker would keep one system prompt instead of four); it takes the least recently used."""
    header = [1, 2, 3]
    system = [[*header, *range(100 * k, 100 * k + 37)] for k in range(1, 4)]
    pool = slots(system[0], system[1], [], [], last_used=(5.0, 6.0, 1.0, 2.0))
    assert pick_slot(pool, [*system[2], 7], id_slot=-1) is pool[2]


def test_all_busy_gives_none() -> None:
    pool = slots([1], [1, 2], busy=(0, 1))
    assert pick_slot(pool, [1, 2], id_slot=-1) is None


def test_pick_does_not_change_the_slots() -> None:
    pool = slots([1, 2], [3])
    before = [(s.tokens[:], s.busy, s.last_used) for s in pool]
    pick_slot(pool, [1, 2], id_slot=-1)
    assert [(s.tokens, s.busy, s.last_used) for s in pool] == before


def test_reuse_is_zero_without_cache_prompt() -> None:
    assert reusable_prefix([1, 2, 3], [1, 2, 3, 4], cache_prompt=False) == 0


def test_reuse_is_the_common_prefix() -> None:
    assert reusable_prefix([1, 2, 3, 9], [1, 2, 3, 4, 5], cache_prompt=True) == 3
    assert reusable_prefix([], [1, 2], cache_prompt=True) == 0
    assert reusable_prefix([7, 8], [1, 2], cache_prompt=True) == 0


def test_full_match_keeps_one_token_to_decode() -> None:
    assert reusable_prefix([1, 2, 3], [1, 2, 3], cache_prompt=True) == 2
    assert reusable_prefix([1, 2, 3, 4, 5], [1, 2, 3], cache_prompt=True) == 2
    assert reusable_prefix([1], [1], cache_prompt=True) == 0


def test_reuse_chunks_moves_a_repeated_block() -> None:
    from worker.kv.slots import reuse_chunks

    # The cache had a 2-token block (9, 9) the new prompt dropped: the rest moves back by 2.
    cached = [1, 2, 9, 9, 10, 11, 12, 13, 14, 99]
    prompt = [1, 2, 10, 11, 12, 13, 14, 50]
    assert reuse_chunks(cached, prompt, 2, 3) == [(4, 2, 5)]


def test_reuse_needs_the_next_prompt_token_in_the_cache() -> None:
    from worker.kv.slots import reuse_chunks

    cached = [1, 2, 3, 10, 11, 12, 13, 14, 99]
    prompt = [1, 2, 7, 10, 11, 12, 13, 14, 50]
    assert reuse_chunks(cached, prompt, 2, 3) == []


def test_reuse_chunks_skips_short_matches_and_keeps_the_last_token() -> None:
    from worker.kv.slots import reuse_chunks

    cached = [5, 9, 9, 20, 21, 22, 23]
    prompt = [5, 20, 21, 22, 23, 8]
    assert reuse_chunks(cached, prompt, 1, 3) == [(3, 1, 4)]
    assert reuse_chunks(cached, prompt, 1, 5) == []
    assert reuse_chunks([5, 20, 21], [5, 20, 21], 1, 1) == [(1, 1, 1)]


def test_without_a_unified_cache_a_cold_prompt_goes_beside_the_busy_slots() -> None:
    """Slots 0-2 busy, 3-7 idle with caches of other prompts, 7 the least recently used:
    llama-server's rule takes 7 (busy 0, 1, 2, 7: two ubatches a step), beside_busy takes 3."""
    pool = slots([1], [2], [3], [4], [5], [6], [7], [8], busy=(0, 1, 2),
                 last_used=(0.0, 0.0, 0.0, 9.0, 5.0, 5.0, 5.0, 1.0))
    assert pick_slot(pool, [42], id_slot=-1) is pool[7]
    assert pick_slot(pool, [42], id_slot=-1, beside_busy=True) is pool[3]


def test_beside_busy_still_prefers_a_matching_cache() -> None:
    pool = slots([1], [9, 9, 9], [5, 6, 7, 8], busy=(0,), last_used=(0.0, 1.0, 2.0))
    assert pick_slot(pool, [5, 6, 7, 8, 1], id_slot=-1, beside_busy=True) is pool[2]


def test_slot_prompt_similarity_sets_how_much_must_match() -> None:
    """-sps: a slot is chosen for its cache only when the prompt shares more than that part of
    it; 0 turns the match off (the least recently used idle slot, as llama-server's 0.0)."""
    pool = slots([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [7, 7], last_used=(5.0, 1.0))
    prompt = [1, 2, 3, 4, 0]
    assert pick_slot(pool, prompt, id_slot=-1) is pool[0]  # 4 of 10 > 0.1
    assert pick_slot(pool, prompt, id_slot=-1, similarity=0.5) is pool[1]  # 4 of 10 < 0.5
    assert pick_slot(pool, prompt, id_slot=-1, similarity=0.0) is pool[1]


def test_held_elsewhere_is_what_comparing_every_pair_says() -> None:
    """One sort instead of every pair (issue 44): the same slots, whatever the caches (shared
    heads, copies, prefixes of one another, empty ones)."""
    def every_pair(slots: list[SlotCache]) -> set[int]:
        held = set()
        for slot in slots:
            n = (3 * len(slot.tokens) + 3) // 4
            if slot.tokens and any(o is not slot and o.tokens[:n] == slot.tokens[:n]
                                   for o in slots):
                held.add(slot.slot_id)
        return held

    rnd = random.Random(44)
    heads = [[1, 7, 7, 7], [1, 7, 7, 8], [1, 9], []]
    for _ in range(300):
        slots = [SlotCache(i, rnd.choice(heads) + [rnd.randrange(3) for _ in
                                                   range(rnd.randrange(0, 12))])
                 for i in range(rnd.randrange(1, 12))]
        assert held_elsewhere(slots) == every_pair(slots)
    assert held_elsewhere([SlotCache(0, [1, 2, 3, 4]), SlotCache(1, [1, 2, 3, 5])]) == {0, 1}
    assert held_elsewhere([SlotCache(0, [1, 2, 3, 4]), SlotCache(1, [1, 2, 5, 5])]) == set()
    assert held_elsewhere([SlotCache(0, [1, 2]), SlotCache(1, [1, 2, 3, 4, 5, 6, 7, 8])]) == {0}
