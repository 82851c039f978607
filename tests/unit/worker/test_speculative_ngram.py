"""The n-gram drafters propose what llama.cpp's do for the same token history
(common/ngram-map.cpp common_ngram_simple_draft, common/ngram-mod.cpp and
common/speculative.cpp's ngram-mod): the expected drafts are worked out by hand from the C++."""

from __future__ import annotations

import random

import pytest

from worker.speculative.config import (
    NgramMapParams,
    NgramModParams,
    SpecConfig,
    UnknownSpecType,
    refusal,
    resolve,
    types_from_names,
)
from worker.speculative.drafter import Drafter
from worker.speculative.ngram_map import NgramMap, NgramMapK, ngram_hash
from worker.speculative.ngram_mod import EMPTY, MULTIPLIER, NgramMod, NgramTable
from worker.speculative.ngram_simple import simple_draft


def test_simple_draft_copies_what_followed_the_nearest_earlier_match() -> None:
    # pattern = tokens[-1:] + [sampled] = [1, 2]; searched from j = cur_len - n - 1 = 5 down:
    # found at 1; copy_max = min(3, 8 - (1 + 2)) = 3: tokens[3:6]
    assert simple_draft(2, 3, [9, 1, 2, 3, 4, 5, 7, 1], 2) == [3, 4, 5]


def test_simple_draft_never_matches_position_zero() -> None:
    assert simple_draft(2, 3, [1, 2, 3, 4, 5, 6, 7, 1], 2) == []


def test_simple_draft_needs_more_than_n_plus_m_tokens() -> None:
    assert simple_draft(2, 3, [9, 1, 2, 3, 4, 1], 2) == []  # cur_len 6 <= 2 + 3 + 1


def test_simple_draft_takes_the_nearest_match_and_copies_at_most_what_follows() -> None:
    # two matches of [1, 2] (at 1 and at 5): the later one; copy_max = min(3, 9 - 7) = 2
    assert simple_draft(2, 3, [0, 1, 2, 8, 8, 1, 2, 3, 1], 2) == [3, 1]
    # [1, 2, 3] found at 5; copy_max = min(5, 10 - (5 + 3)) = 2 < size_n 3: nothing
    assert simple_draft(3, 5, [0, 0, 0, 0, 0, 1, 2, 3, 1, 2], 3) == []


def test_the_hash_is_llama_cpps() -> None:
    """idx = ((t0 * M + t1) * M + t2 ...) mod 2^64 mod size, as size_t arithmetic."""
    table = NgramTable(3, size=1000003)
    expected = ((((5 * MULTIPLIER + 7) % 2**64) * MULTIPLIER + 9) % 2**64) % 1000003
    assert table.index([5, 7, 9]) == expected
    assert NgramTable(2, 4 * 1024 * 1024).index([1, 2]) == 6364136223846793007 % (4 * 1024 * 1024)


def test_adding_many_ngrams_at_once_is_adding_them_one_by_one() -> None:
    """The vectorized add (numpy) leaves the table, and its count of used entries, as the
    C++ loop of add() calls does: collisions in a small table, the last write wins."""
    rng = random.Random(7)
    tokens = [rng.randrange(50) for _ in range(3000)]
    table = NgramTable(4, size=997)
    table.add_all(tokens, 0, len(tokens) - 4)
    entries, used = [EMPTY] * 997, 0
    for i in range(len(tokens) - 4):
        idx = table.index(tokens[i:i + 4])
        if entries[idx] == EMPTY:
            used += 1
        entries[idx] = tokens[i + 4]
    assert table.entries.tolist() == entries and table.used == used


def test_ngram_mod_follows_the_table_from_the_last_ngram() -> None:
    mod = NgramMod(NgramModParams(n_match=2, n_max=4, n_min=2), n_seq=1)
    prompt = [1, 2, 3, 4, 5, 1]
    mod.begin(0, prompt)  # (1,2)->3 (2,3)->4 (3,4)->5 (4,5)->1
    assert mod.draft(0, prompt, 2) == [3, 4, 5, 1]  # n_max 4


def test_ngram_mod_drafts_nothing_when_the_chain_stops_before_n_min() -> None:
    prompt = [1, 2, 3, 4, 5, 1]
    short = NgramMod(NgramModParams(n_match=2, n_max=6, n_min=5), n_seq=1)
    short.begin(0, prompt)
    assert short.draft(0, prompt, 2) == []  # (5,1) is not in the table: stops at 4 < 5
    cut = NgramMod(NgramModParams(n_match=2, n_max=6, n_min=2), n_seq=1)
    cut.begin(0, prompt)
    assert cut.draft(0, prompt, 2) == [3, 4, 5, 1]


def test_ngram_mod_adds_a_sequences_new_ngrams_in_chunks_of_32() -> None:
    mod = NgramMod(NgramModParams(n_match=2, n_max=3, n_min=1), n_seq=1)
    prompt = [100, 101, 102]
    mod.begin(0, prompt)  # i_last = 1
    early = [*prompt, 7, 8, 9, 7]  # 7 tokens: 1 + 32 < 7 is false, nothing new is added
    assert mod.draft(0, early, 8) == []
    grown = [*prompt, *range(200, 230), 7, 8, 9, 7]  # 37 tokens: 1 + 32 < 37
    # keys up to i = 34 are added: (7,8)->9, (8,9)->7; (9,7) has no value yet
    assert mod.draft(0, grown, 8) == [9, 7]


def test_ngram_mod_resets_after_five_drafts_mostly_rejected() -> None:
    mod = NgramMod(NgramModParams(n_match=2, n_max=4, n_min=1), n_seq=1)
    prompt = [1, 2, 3, 4, 5, 1]
    mod.begin(0, prompt)
    for _ in range(4):
        assert mod.draft(0, prompt, 2) == [3, 4, 5, 1]
        mod.accept(0, 0, False)
    assert mod.table.used == 4
    assert mod.draft(0, prompt, 2) == [3, 4, 5, 1]
    mod.accept(0, 0, False)  # the fifth: f_acc 0 < 0.25
    assert mod.table.used == 0 and mod.draft(0, prompt, 2) == []


def test_the_drafter_asks_ngram_simple_first_and_cuts_the_draft_to_the_room() -> None:
    config = resolve(["ngram-mod,ngram-simple"], False,
                     NgramModParams(n_match=2, n_max=4, n_min=1),
                     NgramMapParams(size_n=2, size_m=3))
    assert config.types == ["none", "ngram-mod", "ngram-simple"]
    assert config.name_str() == "none,ngram-mod,ngram-simple"  # as llama-server reports it
    drafter = Drafter(config, n_seq=2)
    assert [m.name for m in drafter.modes] == ["ngram-simple", "ngram-mod"]
    tokens = [9, 1, 2, 3, 4, 5, 7, 1]
    drafter.begin(0, tokens)
    assert drafter.draft(0, tokens, 2, n_max=8) == [3, 4, 5]  # ngram-simple's
    assert drafter.draft(0, tokens, 2, n_max=2) == [3, 4]
    assert drafter.draft(0, [5, 6, 7], 1, n_max=8) == []  # neither has one


def test_spec_type_lists_as_llama_cpp_reads_them() -> None:
    assert types_from_names(["ngram-mod", "none", "ngram-simple"]) == ["none"]
    with pytest.raises(UnknownSpecType, match="unknown speculative type: nope"):
        types_from_names(["nope"])
    assert not resolve(["none"], False, NgramModParams(), NgramMapParams()).enabled
    assert SpecConfig().name_str() == "none" and SpecConfig().n_max() == 0


def test_spec_default_is_ngram_mod_24_48_64() -> None:
    config = resolve([], True, NgramModParams(n_match=3, n_min=1, n_max=2), NgramMapParams())
    assert config.types == ["none", "ngram-mod"]
    assert (config.ngram_mod.n_match, config.ngram_mod.n_min, config.ngram_mod.n_max) == (
        24, 48, 64)
    assert config.n_max() == 64


def test_draft_types_that_need_other_model_families_are_refused_by_name() -> None:
    for name in ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"):
        message = refusal(["none", name])
        assert message is not None and name in message and "cannot load" in message
    assert refusal(["none", "ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                    "ngram-cache"]) is None


def test_the_map_hash_is_llama_cpps_32_bit_lcg() -> None:
    expected = ((3 * 2654435761 + 4) * 2654435761 + 5) % 2**32
    assert ngram_hash([9, 3, 4, 5], 1, 3) == expected


def test_ngram_map_k_drafts_what_followed_the_key_as_much_as_was_accepted() -> None:
    history = [0, 1, 2, 7, 8, 5, 5, 5, 5, 1]  # the key [1, 2] (sampled 2) is found at 1
    keys_only = NgramMap(2, 2, key_only=True, min_hits=1)
    assert keys_only.draft(history, 2) == [7, 8]
    keys_only.accept(1)  # one token of it was accepted: next time only one
    assert keys_only.draft(history, 2) == [7]


def test_ngram_map_k4v_waits_for_min_hits_and_a_clear_favourite() -> None:
    history = [0, 1, 2, 7, 8, 5, 5, 5, 5, 1]
    values = NgramMap(2, 2, key_only=False, min_hits=2)
    assert values.draft(history, 2) == []  # the key's first hit
    assert values.draft(history, 2) == [7, 8]  # its second: one value, seen once
    # two values after [1, 2], once each: the most frequent is not twice the others
    split = [0, 1, 2, 7, 8, 1, 2, 9, 9, 5, 5, 5, 5, 1]
    assert NgramMap(2, 2, key_only=False, min_hits=1).draft(split, 2) == []


def test_the_map_modes_keep_a_map_per_slot_and_ignore_others_accepts() -> None:
    mode = NgramMapK(NgramMapParams(size_n=2, size_m=2), key_only=True, n_seq=2)
    history = [0, 1, 2, 7, 8, 5, 5, 5, 5, 1]
    assert mode.draft(0, history, 2) == [7, 8]
    mode.accept(0, 0, is_other=True)
    assert mode.draft(0, history, 2) == [7, 8]
    mode.accept(0, 0, is_other=False)
    assert mode.draft(0, history, 2) == [] and mode.draft(1, history, 2) == [7, 8]
