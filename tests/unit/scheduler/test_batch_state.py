"""Batch records and progress in a real Redis: atomic updates (a cancel and the driver's
progress never overwrite each other), chunks counted once however often they run, pages,
and the driver's lease."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis as sync_redis
from redis.asyncio import Redis

from scheduler.batches import Batches, BatchRecord
from scheduler.contract import keys
from scheduler.contract.errors import NotFound


@pytest.fixture
async def batches(redis_url: str) -> AsyncIterator[Batches]:
    redis = Redis.from_url(redis_url)
    await redis.flushdb()
    yield Batches(redis)
    await redis.flushdb()
    await redis.aclose()


async def test_final_states_leave_the_active_set(
        batches: Batches) -> None:
    record = BatchRecord(endpoint="/v1/completions", input_file_id="file-x", fleet_model="m")
    await batches.create(record)
    other = BatchRecord(endpoint="/v1/completions", input_file_id="file-y", fleet_model="n")
    await batches.create(other)
    assert await batches.active("m") == [record.id]  # each model's pods drive its own
    assert await batches.active("n") == [other.id]

    def finish(r: BatchRecord) -> BatchRecord:
        r.status = "cancelled"
        return r

    await batches.update(record.id, finish)
    assert await batches.active("m") == []
    assert "fleet_model" not in record.to_wire()
    with pytest.raises(NotFound):
        await batches.get("batch_missing")


async def test_a_concurrent_write_makes_update_read_again(batches: Batches,
                                                         redis_url: str) -> None:
    record = BatchRecord(endpoint="/v1/completions", input_file_id="file-x")
    await batches.create(record)
    seen: list[str] = []

    def change(r: BatchRecord) -> BatchRecord:
        seen.append(r.status)
        if len(seen) == 1:  # a write lands between this read and this write
            cancelled = r.model_copy(update={"status": "cancelling"})
            sync_redis.Redis.from_url(redis_url).set(keys.batch_record(r.id),
                                                    cancelled.model_dump_json())
        r.request_counts.failed = 1
        return r

    result = await batches.update(record.id, change)
    assert seen == ["validating", "cancelling"]  # the change ran again on the new record
    assert result.status == "cancelling" and result.request_counts.failed == 1


async def test_a_chunk_run_twice_counts_once(batches: Batches) -> None:
    await batches.chunk_done("batch_a", 0, 3, 1)
    await batches.chunk_done("batch_a", 0, 4, 0)  # the chunk ran again: replaced
    await batches.chunk_done("batch_a", 1, 2, 0)
    progress = await batches.progress("batch_a")
    assert progress.chunks == {0: (4, 0), 1: (2, 0)}
    assert (progress.completed, progress.failed) == (6, 0)
    assert await batches.counters() == {"lines_completed": 5, "lines_failed": 1}


async def test_pages_newest_first(batches: Batches) -> None:
    ids = []
    for created in range(5):
        record = BatchRecord(endpoint="/v1/completions", input_file_id="f",
                             created_at=1000 + created)
        await batches.create(record)
        ids.append(record.id)
    page, more = await batches.page(None, 2)
    assert [r.id for r in page] == [ids[4], ids[3]] and more
    page, more = await batches.page(ids[3], 3)
    assert [r.id for r in page] == [ids[2], ids[1], ids[0]] and not more
    with pytest.raises(NotFound):
        await batches.page("batch_unknown", 2)


async def test_one_driver_at_a_time(batches: Batches) -> None:
    assert await batches.take("batch_a", "pod-1")
    assert not await batches.take("batch_a", "pod-2")
    assert await batches.renew("batch_a", "pod-1")
    assert not await batches.renew("batch_a", "pod-2")
    await batches.let_go("batch_a", "pod-2")  # not its lease: nothing happens
    assert not await batches.take("batch_a", "pod-2")
    await batches.let_go("batch_a", "pod-1")
    assert await batches.take("batch_a", "pod-2")
