"""-lcd shared through the object store (worker/speculative/lookup_share.py): two workers'
saves of the dynamic lookup cache add up, whatever their timing (real Redis for the lock, a
real local-folder store, the savers' own processes, llama.cpp's cache file format)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from redis.asyncio import Redis

from scheduler.connections import open_redis
from worker.speculative import ngram_cache as nc
from worker.speculative.lookup_share import LookupShare

MODEL_SHA = "0" * 64


async def _share(redis: Redis, store: Path, path: Path) -> tuple[LookupShare, nc.NgramCache]:
    share = LookupShare(str(store), None, redis, MODEL_SHA, path)
    await share.fetch()
    return share, nc.NgramCache(1, nc_dynamic=nc.load_file(str(path), missing_ok=True),
                                learns=True)


def _counted(*runs: list[int]) -> nc.Cache:
    cache: nc.Cache = {}
    nc.count_runs(cache, list(runs))
    return cache


async def test_saves_of_two_workers_add_up(redis_url: str, tmp_path: Path) -> None:
    redis = open_redis(redis_url)
    store = tmp_path / "store"
    seed = _counted([1, 2, 3, 1, 2, 3])
    for worker in "abc":  # each worker's own folder; one -lcd name: one cache
        (tmp_path / worker).mkdir()
    (tmp_path / "a" / "dyn.bin").write_bytes(nc.dumps(seed))  # worker A's -lcd file: the seed
    a, cache_a = await _share(redis, store, tmp_path / "a" / "dyn.bin")
    b, cache_b = await _share(redis, store, tmp_path / "b" / "dyn.bin")
    assert flat_counts(cache_b.nc_dynamic) == flat_counts(seed)  # A seeded the store
    _, cache_other = await _share(redis, store, tmp_path / "b" / "other.bin")
    assert cache_other.nc_dynamic == {}  # another name: another cache
    rng = random.Random(7)
    runs_a = [[rng.randrange(50) for _ in range(4000)] for _ in range(3)]
    runs_b = [[rng.randrange(50) for _ in range(4000)] for _ in range(3)]
    for run in runs_a:
        cache_a.learn(run)
    for run in runs_b:
        cache_b.learn(run)
    try:
        assert await asyncio.gather(a.save(cache_a), b.save(cache_b)) == [True, True]
        want = _counted(*runs_a, *runs_b)
        nc.merge(want, seed)
        stored = nc.loads((store / a.key).read_bytes())
        assert flat_counts(stored) == flat_counts(want)
        # the -lcd files hold what their worker stored: the one that saved last, all of it
        files = [flat_counts(nc.load_file(str(share.path))) for share in (a, b)]
        assert flat_counts(want) in files
        # a third worker starts from the store's copy
        c, cache_c = await _share(redis, store, tmp_path / "c" / "dyn.bin")
        assert flat_counts(cache_c.nc_dynamic) == flat_counts(want)
        assert await c.save(cache_c)  # nothing learned: nothing written
        assert flat_counts(nc.loads((store / c.key).read_bytes())) == flat_counts(want)
    finally:
        for share in (a, b):
            share.close()
        await redis.aclose()


def flat_counts(cache: nc.Cache) -> dict[tuple[nc.Ngram, int], int]:
    """(n-gram, token) → count: two caches with equal counts in any order compare equal."""
    return {(ngram, token): count for ngram, part in cache.items()
            for token, count in part.items()}
