"""Batch jobs (the OpenAI Batch API): a batch's record and progress in Redis, and the lease of
the driver that runs it.

A batch's input, its result chunks and its output files live in object storage (storage/files.py);
Redis holds what changes while it runs: the record (the OpenAI Batch object, with the chunk plan),
which chunks are done and their line counts, and who drives it. Every change of a record is a
WATCH/MULTI transaction (`update`), so that a cancel from one api pod and the driver's progress on
another never overwrite each other.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field
from redis.asyncio import Redis
from redis.exceptions import WatchError

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import NotFound

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed",
                      "expired", "cancelling", "cancelled"]
FINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""The endpoints a batch may run (OpenAI's, less those llamaq does not serve)."""
COMPLETION_WINDOW_S = 24 * 3600
MAX_LINES = 50_000
MAX_INPUT_BYTES = 200 * 1024 * 1024
MAX_METADATA_PAIRS = 16
LIST_LIMIT_MAX = 100


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


class BatchError(DeferredModel):
    """One reason a batch failed validation (OpenAI's BatchError)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(DeferredModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(DeferredModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchPlan(DeferredModel):
    """How a batch is cut into chunks (ours; not on the wire)."""

    lines: int = 0
    chunk_size: int = 0

    @property
    def n_chunks(self) -> int:
        return -(-self.lines // self.chunk_size) if self.chunk_size else 0

    def chunk_lines(self, index: int) -> range:
        return range(index * self.chunk_size, min(self.lines, (index + 1) * self.chunk_size))


class BatchRecord(DeferredModel):
    """The OpenAI Batch object, and the plan of its chunks."""

    id: str = Field(default_factory=new_batch_id)
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: BatchStatus = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int = Field(default_factory=now)
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    plan: BatchPlan = Field(default_factory=BatchPlan)
    fleet_model: str = ""
    """The model whose workers run it: the model of the api pod that created it (only the
    pods serving that model drive it). Not on the wire."""
    failed_runs: int = 0
    """Driver runs that ended in an error (the store down, a full disk): each waits longer
    before the next (`retry_at`); past MAX_FAILED_RUNS the batch fails. Not on the wire."""
    retry_at: float = 0.0
    owner: str = "default"
    """The tenant that made it (--tenants). Not on the wire."""

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json",
                               exclude={"plan", "fleet_model", "failed_runs", "retry_at",
                                        "owner"})


MAX_FAILED_RUNS = 10
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0


def retry_delay_s(failed_runs: int) -> float:
    """How long a batch waits after its `failed_runs`-th failed run: 5 s, doubling, at most
    5 min (about half an hour in all before the batch fails)."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, failed_runs - 1))


class Progress(DeferredModel):
    """The finished chunks of a batch and their line counts."""

    chunks: dict[int, tuple[int, int]]
    """chunk index -> (completed lines, failed lines)"""

    @property
    def completed(self) -> int:
        return sum(c for c, _ in self.chunks.values())

    @property
    def failed(self) -> int:
        return sum(f for _, f in self.chunks.values())


RENEW_LEASE = """
-- KEYS[1]: a batch's driver lease; ARGV: the holder's token, lease (ms). 1 if still held.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Batches:
    """Batch records, their progress and their drivers' leases in Redis."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def create(self, record: BatchRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.batch_record(record.id), record.model_dump_json())
            pipe.zadd(keys.BATCHES, {record.id: time.time()})  # not created_at: seconds tie
            pipe.sadd(keys.batches_active(record.fleet_model), record.id)
            await pipe.execute()

    async def get(self, batch_id: str) -> BatchRecord:
        raw = await self._redis.get(keys.batch_record(batch_id))
        if raw is None:
            raise NotFound(f"No batch found with id '{batch_id}'")
        return BatchRecord.model_validate_json(raw)

    async def update(self, batch_id: str,
                     change: Callable[[BatchRecord], BatchRecord | None]) -> BatchRecord:
        """Apply `change` to the stored record atomically (it may run more than once; None
        leaves the record as it is). A record that reaches a final state leaves the active
        set and expires after BATCH_RECORD_TTL_S."""
        key = keys.batch_record(batch_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        raise NotFound(f"No batch found with id '{batch_id}'")
                    record = BatchRecord.model_validate_json(raw)
                    changed = change(record.model_copy(deep=True))
                    if changed is None:
                        await pipe.unwatch()
                        return record
                    pipe.multi()
                    pipe.set(key, changed.model_dump_json())
                    if changed.final:
                        pipe.srem(keys.batches_active(changed.fleet_model), batch_id)
                        pipe.expire(key, keys.BATCH_RECORD_TTL_S)
                        pipe.expire(keys.batch_chunks(batch_id), keys.BATCH_RECORD_TTL_S)
                    await pipe.execute()
                    return changed
                except WatchError:
                    continue

    async def page(self, after: str | None, limit: int,
                   owner: str | None = None) -> tuple[list[BatchRecord], bool]:
        """Newest first; `after` is the id of the last batch of the previous page; `owner`:
        only that tenant's batches."""
        start = 0
        if after:
            rank = await self._redis.zrevrank(keys.BATCHES, after)
            if rank is None:
                raise NotFound(f"No batch found with id '{after}'")
            start = rank + 1
        records: list[BatchRecord] = []
        step = limit + 1 if owner is None else max(100, limit + 1)
        while len(records) <= limit:
            ids = await self._redis.zrevrange(keys.BATCHES, start, start + step - 1)
            if not ids:
                break
            start += len(ids)
            for batch_id in ids:
                raw = await self._redis.get(keys.batch_record(_text(batch_id)))
                if raw is None:
                    continue
                record = BatchRecord.model_validate_json(raw)
                if owner is None or record.owner == owner:
                    records.append(record)
            if owner is None:
                break
        return records[:limit], len(records) > limit

    async def forget_expired(self) -> None:
        """Drop ids whose record expired from the listing."""
        ids = await self._redis.zrange(keys.BATCHES, 0, -1)
        for batch_id in ids:
            if not await self._redis.exists(keys.batch_record(_text(batch_id))):
                await self._redis.zrem(keys.BATCHES, batch_id)

    async def active(self, model_id: str) -> list[str]:
        """The model's batches not in a final state."""
        members = await self._redis.smembers(keys.batches_active(model_id))  # type: ignore[misc]
        return sorted(_text(b) for b in members)

    # -- progress ------------------------------------------------------------------------

    async def chunk_done(self, batch_id: str, index: int, completed: int, failed: int) -> None:
        """Record a finished chunk (a re-run overwrites its counts); the fleet's line
        counters grow only the first time."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(keys.batch_chunks(batch_id), str(index), f"{completed} {failed}")
            pipe.hset(keys.batch_chunks(batch_id), str(index), f"{completed} {failed}")
            first, _ = await pipe.execute()
        if first:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hincrby(keys.BATCH_COUNTERS, "lines_completed", completed)
                pipe.hincrby(keys.BATCH_COUNTERS, "lines_failed", failed)
                await pipe.execute()

    async def progress(self, batch_id: str) -> Progress:
        raw = await self._redis.hgetall(keys.batch_chunks(batch_id))  # type: ignore[misc]
        chunks = {}
        for index, counts in raw.items():
            completed, failed = _text(counts).split()
            chunks[int(index)] = (int(completed), int(failed))
        return Progress(chunks=chunks)

    async def with_counts(self, record: BatchRecord) -> BatchRecord:
        """The record with request_counts from its finished chunks (while it runs)."""
        if record.status not in ("in_progress", "finalizing", "cancelling"):
            return record
        progress = await self.progress(record.id)
        record.request_counts = RequestCounts(total=record.plan.lines,
                                              completed=progress.completed,
                                              failed=progress.failed)
        return record

    async def counters(self) -> dict[str, int]:
        raw = await self._redis.hgetall(keys.BATCH_COUNTERS)  # type: ignore[misc]
        return {_text(k): int(v) for k, v in raw.items()}

    # -- drivers' leases -----------------------------------------------------------------

    async def take(self, batch_id: str, token: str) -> bool:
        """Become the batch's driver if nobody is."""
        return bool(await self._redis.set(keys.batch_driver(batch_id), token, nx=True,
                                          px=int(keys.BATCH_LEASE_S * 1000)))

    async def renew(self, batch_id: str, token: str) -> bool:
        held = await self._redis.eval(RENEW_LEASE, 1, keys.batch_driver(batch_id), token,  # type: ignore[misc]
                                      str(int(keys.BATCH_LEASE_S * 1000)))
        return bool(held)

    async def let_go(self, batch_id: str, token: str) -> None:
        await self._redis.eval(RELEASE_LEASE, 1, keys.batch_driver(batch_id), token)  # type: ignore[misc]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
