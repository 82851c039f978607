"""-lcd through the object store: one dynamic lookup cache (ngram-cache) that every worker of a
model grows and reuses. Ours: llama-server reads -lcd once and never writes it (its
save_dynamic is false); llama.cpp's lookup example counts each generation into it and saves it
at its end, which is what a save does here for the requests that ended since the last one.

Owns: the cache's store key (the model file's hash, the -lcd file's name); the copy fetched to
the -lcd file at start, which the engine then reads (a file and no stored copy: the file seeds
the store); and the saves: every SAVE_EVERY_S the token runs the engine learned are counted
and merged into the stored cache under a Redis lock (read, merge, write: no worker's counts
are lost to another's save), and the result is written back to the -lcd file. A save that
fails (Redis or the store away) keeps its runs for the next one, at most
LOOKUP_UNSAVED_MAX_TOKENS of them (the oldest go). The lock is renewed while the save runs
(a cache of many MiB takes longer than the lock's lifetime); runs whose save wrote the store
are never counted again, even when the lock was lost on the way (a late release). The cache is
pruned to LOOKUP_CACHE_MAX_BYTES (the n-grams seen most often are kept).

A save parses and writes the whole cache, seconds of Python for a cache of many MiB, so it
runs in a process of its own (spawned once): in a thread it would hold the GIL the engine's
steps need. The engine's drafter keeps the cache it read at start (as llama-server does); a
worker reads what the fleet learned when it starts again (or wakes from an idle sleep).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from scheduler.contract import keys, limits
from storage import open_store
from storage.errors import ObjectNotFound, StorageError
from worker.speculative.ngram_cache import (
    CacheFileError,
    NgramCache,
    count_runs,
    dumps,
    load_file,
    loads,
    prune,
)

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

log = logging.getLogger(__name__)

SAVE_EVERY_S = 30.0
LOCK_HOLD_S = 120.0
"""The lock lapses after this long (a worker that died holding it)."""
LOCK_WAIT_S = 10.0
FAILURES = (RedisError, LockError, StorageError, CacheFileError, OSError, BrokenExecutor)


class LookupShare:
    def __init__(self, store_url: str, s3_endpoint_url: str | None, redis: Redis,
                 model_sha: str, path: Path,
                 max_bytes: int = limits.LOOKUP_CACHE_MAX_BYTES,
                 max_unsaved_tokens: int = limits.LOOKUP_UNSAVED_MAX_TOKENS) -> None:
        self.path = path
        self.lock_hold_s = LOCK_HOLD_S
        self.max_bytes = max_bytes
        self.max_unsaved_tokens = max_unsaved_tokens
        self.key = f"lookup-cache/{model_sha}/{path.name}"
        self._store = (store_url, s3_endpoint_url)
        self._redis = redis
        self._lock_key = keys.lookup_cache_lock(model_sha, path.name)
        self._unsaved: list[list[int]] = []
        """Runs learned and not yet in the store (a save failed)."""
        self._unsaved_tokens = 0
        self._saver: ProcessPoolExecutor | None = None

    async def fetch(self) -> None:
        """Before the engine reads the -lcd file: the stored cache to it, or the file to the
        store when it has none. A stored copy that does not parse is left alone, as is a store
        or Redis that fails: the worker starts from its file, with the reason logged."""
        try:
            async with self._lock():
                await asyncio.to_thread(fetch_or_seed, *self._store, self.key, self.path)
        except FAILURES as error:
            log.error("lookup cache %s: not fetched (%s); starting from %s", self.key, error,
                      self.path)

    async def run(self, learned_by: Callable[[], NgramCache | None]) -> None:
        """Every SAVE_EVERY_S, save what `learned_by()` learned (the engine of the moment's
        cache: an idle sleep makes a new engine), until cancelled."""
        while True:
            await asyncio.sleep(SAVE_EVERY_S)
            if (cache := learned_by()) is not None:
                await self.save(cache)

    async def save(self, learned_by: NgramCache) -> bool:
        """Count the runs `learned_by` learned since the last save into the stored cache;
        False when they could not be stored (they wait for the next save)."""
        self._keep(learned_by.take_learned())
        if not self._unsaved:
            return True
        if self._saver is None:  # imported here: a worker without -lcd never loads them
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._saver = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"))
        lock = self._lock()
        try:
            if not await lock.acquire():
                raise LockError(f"held by another save for {LOCK_WAIT_S} s")
        except FAILURES as error:
            log.warning("lookup cache %s: not saved (lock: %s); its runs wait for the next "
                        "save", self.key, error)
            return False
        try:
            size = await self._merge(lock, self._saver)
        except FAILURES as error:
            log.warning("lookup cache %s: not saved (%s); its runs wait for the next save",
                        self.key, error)
            if isinstance(error, BrokenExecutor):
                self.close()
            return False
        finally:
            await _release(lock, self.key)
        log.info("lookup cache %s: %d runs saved (%d bytes)", self.key, len(self._unsaved),
                 size)
        self._unsaved, self._unsaved_tokens = [], 0  # in the store: never counted again
        return True

    def _keep(self, runs: list[list[int]]) -> None:
        """Add `runs` to those waiting for a save; past max_unsaved_tokens the oldest go."""
        self._unsaved += runs
        self._unsaved_tokens += sum(map(len, runs))
        dropped = 0
        while self._unsaved_tokens > self.max_unsaved_tokens and dropped < len(self._unsaved):
            self._unsaved_tokens -= len(self._unsaved[dropped])
            dropped += 1
        if dropped:
            del self._unsaved[:dropped]
            log.warning("lookup cache %s: %d unsaved runs dropped (more than %d tokens wait)",
                        self.key, dropped, self.max_unsaved_tokens)

    async def _merge(self, lock: Lock, saver: ProcessPoolExecutor) -> int:
        """merge_into_store in the saver's process, the lock renewed meanwhile."""
        loop = asyncio.get_running_loop()
        merging = loop.run_in_executor(saver, merge_into_store, *self._store, self.key,
                                       self.path, self._unsaved, self.max_bytes)
        renewing = asyncio.create_task(self._renew(lock))
        try:
            return await merging
        finally:
            renewing.cancel()

    async def _renew(self, lock: Lock) -> None:
        """Reset the lock's lifetime every third of it until cancelled (or the lock is lost:
        the save goes on; another save may then overwrite its counts, never count them
        twice)."""
        while True:
            await asyncio.sleep(self.lock_hold_s / 3)
            try:
                await lock.reacquire()
            except LockError as error:
                log.warning("lookup cache %s: lock lost during a save (%s)", self.key, error)
                return
            except RedisError as error:
                log.warning("lookup cache %s: lock not renewed (%s); retrying", self.key,
                            error)

    def close(self) -> None:
        if self._saver is not None:
            self._saver.shutdown(wait=False, cancel_futures=True)
            self._saver = None

    def _lock(self) -> Lock:
        return self._redis.lock(self._lock_key, timeout=self.lock_hold_s,
                                blocking_timeout=LOCK_WAIT_S)


async def _release(lock: Lock, key: str) -> None:
    """Let the lock go; one lost meanwhile (it lapsed) is only logged: what the save wrote
    stays written."""
    try:
        await lock.release()
    except (LockError, RedisError) as error:
        log.warning("lookup cache %s: lock not released (%s)", key, error)


def fetch_or_seed(store_url: str, s3_endpoint_url: str | None, key: str, path: Path) -> None:
    store = open_store(store_url, s3_endpoint_url)
    try:
        data = store.get_bytes(key)
    except ObjectNotFound:
        if path.is_file() and (seed := path.read_bytes()):
            loads(seed, str(path))
            store.put_bytes(key, seed)
            log.info("lookup cache %s: seeded from %s (%d bytes)", key, path, len(seed))
        return
    loads(data, key)
    _write(path, data)
    log.info("lookup cache %s: fetched to %s (%d bytes)", key, path, len(data))


def merge_into_store(store_url: str, s3_endpoint_url: str | None, key: str, path: Path,
                     runs: list[list[int]], max_bytes: int = limits.LOOKUP_CACHE_MAX_BYTES
                     ) -> int:
    """The stored cache (else the -lcd file, when the store lost it) with `runs` counted in,
    pruned to `max_bytes`, written to the store and to the -lcd file; its size (in the saver's
    process, under the lock). Once the store has it the save has happened: a -lcd file that
    cannot be written is only logged (the next start fetches the store's copy)."""
    store = open_store(store_url, s3_endpoint_url)
    try:
        merged = loads(store.get_bytes(key), key)
    except ObjectNotFound:
        merged = load_file(str(path), missing_ok=True)
    count_runs(merged, runs)
    data = dumps(prune(merged, max_bytes))
    store.put_bytes(key, data)
    try:
        _write(path, data)
    except OSError as error:
        log.warning("lookup cache %s: saved, but %s not written (%s)", key, path, error)
    return len(data)


def _write(path: Path, data: bytes) -> None:
    """Atomically: an engine made after an idle sleep reads whole files only."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(path)
