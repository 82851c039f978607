"""ngram-cache (lookup decoding): drafts derived by hand from llama.cpp's
common/ngram-cache.cpp and common_speculative_impl_ngram_cache (see the comments)."""

from __future__ import annotations

import struct

import pytest

from worker.speculative import ngram_cache as nc
from worker.speculative.config import SpecConfig
from worker.speculative.drafter import Drafter


def test_periodic_context_drafts_eight_tokens() -> None:
    # every 4-gram of the period was seen, each followed by one token (size 4: min 1, 50%)
    mode = nc.NgramCache(1)
    assert mode.draft(0, [1, 2, 3, 1, 2, 3, 1, 2], 3) == [1, 2, 3, 1, 2, 3, 1, 2]


def test_one_gram_below_sixty_six_percent_drafts_nothing() -> None:
    # (5) → {6:1, 7:1}: 2 samples, 50% < 66% (lax, size 1); no longer n-gram was seen
    assert nc.NgramCache(1).draft(0, [5, 6, 5, 7], 5) == []


def test_static_two_gram_weights_the_context_choice() -> None:
    # (8,5) → {6:1, 7:1} passes lax size 2 (2 samples, 50%); the static (8,5) → {7:3}
    # weighs 7 by 300 against 6's 1; then (8,5,7) → 8, (8,5,7,8) → 5, and again
    static = {nc.ngram_of([8, 5]): {7: 3}}
    mode = nc.NgramCache(1, nc_static=static)
    assert mode.draft(0, [8, 5, 6, 8, 5, 7, 8], 5) == [7, 8, 5, 7, 8, 5, 7, 8]


def test_static_alone_needs_two_samples_and_half() -> None:
    # the static cache alone: lax thresholds of size 2 (2 samples, 50%)
    def static(part: dict[int, int]) -> list[int]:
        return nc.NgramCache(1, nc_static={nc.ngram_of([1, 2]): part}).draft(0, [0, 0, 1], 2)
    assert static({9: 2, 4: 1, 5: 1}) == [9]  # 200 ≥ 50×4
    assert static({9: 2, 4: 2, 5: 1}) == []  # 200 < 50×5
    assert static({9: 1}) == []  # 1 sample


def test_dynamic_is_strict() -> None:
    few = nc.NgramCache(1, nc_dynamic={nc.ngram_of([3]): {4: 3}})  # 3 < 4 samples
    assert few.draft(0, [0, 1, 2], 3) == []
    enough = nc.NgramCache(1, nc_dynamic={nc.ngram_of([3]): {4: 4}})
    assert enough.draft(0, [0, 1, 2], 3) == [4]
    # size 2: 3 samples, 66%: {4:2, 5:1} passes (200 ≥ 198), {4:2, 5:2} does not
    two = nc.NgramCache(1, nc_dynamic={nc.ngram_of([2, 3]): {4: 2, 5: 1}})
    assert two.draft(0, [0, 1, 2], 3) == [4]
    no = nc.NgramCache(1, nc_dynamic={nc.ngram_of([2, 3]): {4: 2, 5: 2}})
    assert no.draft(0, [0, 1, 2], 3) == []


@pytest.mark.parametrize(("inserted", "order"), [
    # printed by a g++ 12 program (libstdc++'s unordered_map<int, int>, emplace one at a time,
    # then iterated): the newest first of its bucket's run (13 buckets: 5, 18, 31 share one),
    # else first; the 14th element rehashes to 29 buckets, re-threading the nodes
    ([5, 18, 31], [31, 18, 5]),
    ([1, 14, 2, 27], [2, 27, 14, 1]),
    (list(range(14)), [13, *range(13)]),
    ([262143, 7, 20, 33], [33, 20, 7, 262143]),
])
def test_parts_iterate_in_libstdcxx_order(inserted: list[int], order: list[int]) -> None:
    part: dict[int, int] = {}
    for token in inserted:
        part = nc.emplace(part, token, 1)
    assert list(part) == order


@pytest.mark.parametrize(("prompt", "id_last", "drafted"), [
    # (0,1) → {0:1, 3:1}: a tie (size 2: 2 samples, 50%); llama.cpp's strict `>` keeps the
    # first in its unordered_map's order, 3 (the newer: inserted at the front)
    ([0, 1, 0, 1, 3], 0, [1, 3, 0, 1, 3, 0, 1, 3]),
    # (1,2,3,4) → {5:1, 6:1} (size 4: 1 sample, 50%): 6
    ([1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3], 4, [6, 1, 2, 3, 4, 6, 1, 2]),
])
def test_a_tie_drafts_what_llama_cpp_drafts(prompt: list[int], id_last: int,
                                           drafted: list[int]) -> None:
    """The drafts printed by llama.cpp's own common/ngram-cache.cpp (the vendored source,
    built with g++ 12 into a program that drafts as common_speculative_impl_ngram_cache's
    draft_one); taking the first counted of a tie drafted [1, 0, 1, 0, ...] and [5, ...]."""
    assert nc.NgramCache(1).draft(0, prompt, id_last) == drafted


def test_context_grows_in_runs_as_llama_cpp() -> None:
    # the runs [1,2,3], [4,1], [2,3,4]: (3,4) and (2,3,4) → 1 straddle runs and are not counted
    mode = nc.NgramCache(1)
    assert mode.draft(0, [1, 2], 3) == []
    assert mode.draft(0, [1, 2, 3, 4], 1) == []
    assert mode.draft(0, [1, 2, 3, 4, 1, 2, 3], 4) == []
    # counted over the whole sequence at once, (2,3,4) → {1:1} drafts (size 3: min 1)
    fresh = nc.NgramCache(1)
    assert fresh.draft(0, [1, 2, 3, 4, 1, 2, 3], 4)[:1] == [1]


def test_sequences_have_their_own_context() -> None:
    mode = nc.NgramCache(2)
    assert mode.draft(0, [1, 2, 3, 1, 2, 3, 1, 2], 3)
    assert mode.draft(1, [1, 2], 3) == []


def test_file_format_is_llama_cpps() -> None:
    cache: nc.Cache = {}
    nc.update(cache, 1, 2, [7, 8, 7], 3)
    data = nc.dumps(cache)
    one = struct.pack("<4ii", 7, -1, -1, -1, 1) + struct.pack("<ii", 8, 1)
    assert one in data
    assert len(data) == 3 * 20 + 3 * 8  # (7)→8, (8)→7, (7,8)→7
    assert nc.loads(data) == cache
    merged = nc.loads(data)
    nc.merge(merged, cache)
    assert merged[nc.ngram_of([7])] == {8: 2}


@pytest.mark.parametrize("data", [
    struct.pack("<4i", 1, -1, -1, -1),
    struct.pack("<4ii", 1, -1, -1, -1, 0),
    struct.pack("<4iiii", 1, -1, -1, -1, 1, 2, 0),
    struct.pack("<4iiii", 1, -1, -1, -1, 1, 2, 1) + b"\0",
])
def test_bad_files_are_refused(data: bytes) -> None:
    with pytest.raises(nc.CacheFileError):
        nc.loads(data)


def test_drafter_loads_the_files(tmp_path) -> None:
    path = tmp_path / "static.bin"
    path.write_bytes(nc.dumps({nc.ngram_of([1, 2]): {9: 2}}))
    config = SpecConfig(types=["none", "ngram-cache"], lookup_cache_static=str(path))
    drafter = Drafter(config, 1)
    assert drafter.n_max == 8
    assert drafter.draft(0, [0, 1], 2, 8) == [9]
    missing = SpecConfig(types=["none", "ngram-cache"],
                         lookup_cache_static=str(tmp_path / "none.bin"))
    with pytest.raises(nc.CacheFileError, match="failed to open lookup cache"):
        Drafter(missing, 1)
    dynamic = SpecConfig(types=["none", "ngram-cache"],
                         lookup_cache_dynamic=str(tmp_path / "none.bin"))
    learner = Drafter(dynamic, 1)  # -lcd is written by llamaq: none there yet is empty
    cache = learner.ngram_cache
    assert cache is not None and cache.nc_dynamic == {}
    learner.learn([5, 6, 7])
    assert cache.take_learned() == [[5, 6, 7]]
    assert cache.take_learned() == []
    assert Drafter(config, 1).ngram_cache is not None
    Drafter(config, 1).learn([1])  # without -lcd nothing is kept
