"""The fleet's -lcd lookup cache is capped (issue 43, item 12): the cache file in bytes (the
n-grams seen most often are kept), the runs a worker keeps while its saves fail in tokens (the
oldest go)."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from worker.speculative import ngram_cache as nc
from worker.speculative.lookup_share import LookupShare


def test_a_cache_past_its_bytes_keeps_the_ngrams_seen_most_often() -> None:
    cache: nc.Cache = {}
    nc.count_runs(cache, [[1, 2] * 500, list(range(100, 400))])
    assert nc.file_size(cache) == len(nc.dumps(cache))
    assert nc.prune(cache, nc.file_size(cache)) is cache
    pruned = nc.prune(cache, 300)  # room for 8 n-grams of one token each
    assert len(nc.dumps(pruned)) <= 300 * 3 // 4 and len(pruned) == 8
    assert (1, -1, -1, -1) in pruned and (2, 1, 2, 1) in pruned  # seen 500 times
    assert (100, -1, -1, -1) not in pruned  # once
    assert list(pruned) == [k for k in cache if k in pruned]  # the order kept


def test_runs_waiting_for_a_save_are_capped_in_tokens(tmp_path: Path) -> None:
    share = LookupShare(str(tmp_path), None, Redis(), "0" * 64, tmp_path / "dyn.bin",
                        max_unsaved_tokens=1000)
    share._keep([[1] * 400, [2] * 400])
    share._keep([[3] * 400])
    assert share._unsaved == [[2] * 400, [3] * 400]  # the oldest went
    share._keep([[4] * 5000])  # longer than the cap alone: none of it waits
    assert share._unsaved == [] and share._unsaved_tokens == 0
