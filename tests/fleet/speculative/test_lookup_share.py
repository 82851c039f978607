"""-lcd shared through the object store (worker/speculative/lookup_share.py): two workers'
saves of the dynamic lookup cache add up, whatever their timing (real Redis for the lock, a
real local-folder store, the savers' own processes, llama.cpp's cache file format)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scheduler.connections import open_redis
from worker.speculative import lookup_share
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


HOLD_S = 0.6
"""The lock's lifetime in the tests below: a save takes longer (the saver's process starts,
then counts 40,000 tokens)."""


async def test_a_slow_save_beside_a_second_worker_keeps_the_lock_and_both_counts(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker A's save outlasts the lock's lifetime; B saves meanwhile. A renews the lock, so
    B waits for it: the store has both workers' runs, each counted once (the lock used to
    lapse under A: B merged beside it and one save overwrote the other, and A's late release
    failed its save, whose runs the next save counted again)."""
    monkeypatch.setattr(lookup_share, "LOCK_HOLD_S", HOLD_S)
    redis = open_redis(redis_url)
    store = tmp_path / "store"
    for worker in "ab":  # each worker's own folder; one -lcd name: one cache
        (tmp_path / worker).mkdir()
    a, cache_a = await _share(redis, store, tmp_path / "a" / "slow.bin")
    b, cache_b = await _share(redis, store, tmp_path / "b" / "slow.bin")
    rng = random.Random(12)
    runs_a = [[rng.randrange(5000) for _ in range(20_000)] for _ in range(2)]
    runs_b = [[rng.randrange(50) for _ in range(2000)]]
    for run in runs_a:
        cache_a.learn(run)
    for run in runs_b:
        cache_b.learn(run)
    try:
        saving_a = asyncio.create_task(a.save(cache_a))
        await asyncio.sleep(0.2)  # A holds the lock
        started = time.monotonic()
        assert await b.save(cache_b)
        assert await saving_a
        print(f"B waited and saved in {time.monotonic() - started:.1f} s")
        want = _counted(*runs_a, *runs_b)
        assert flat_counts(nc.loads((store / a.key).read_bytes())) == flat_counts(want)
        assert await a.save(cache_a) and await b.save(cache_b)  # nothing new: no change
        assert flat_counts(nc.loads((store / a.key).read_bytes())) == flat_counts(want)
    finally:
        for share in (a, b):
            share.close()
        await redis.aclose()


async def test_a_lock_lost_during_a_save_counts_its_runs_once(
        redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock vanishes while a save runs (it lapsed: Redis was away longer than its
    lifetime): the save's runs are in the store, and the next save does not count them
    again."""
    monkeypatch.setattr(lookup_share, "LOCK_HOLD_S", 30.0)
    redis = open_redis(redis_url)
    store = tmp_path / "store"
    a, cache_a = await _share(redis, store, tmp_path / "lost.bin")
    rng = random.Random(5)
    runs = [[rng.randrange(50) for _ in range(4000)]]
    cache_a.learn(runs[0])
    try:
        saving = asyncio.create_task(a.save(cache_a))
        await asyncio.sleep(0.2)
        assert await redis.delete(a._lock_key) == 1  # lapsed while the saver works
        await saving
        assert await a.save(cache_a)  # nothing new
        assert flat_counts(nc.loads((store / a.key).read_bytes())) == flat_counts(
            _counted(*runs))
    finally:
        a.close()
        await redis.aclose()
