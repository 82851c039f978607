"""Final results too big for Redis go through the object store (issue 27, hole 3): a worker
writes the result's JSON at `results/<job id>.json`, its event log keeps a small event naming
it, the api hands the client the whole result; a sweep deletes stored results past their
lifetime, and a result that is gone answers 404, not a 500. Real Redis, real store folder,
the real tiny-model fleet."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.errors import NotFound
from scheduler.contract.jobs import TokenizeJob
from scheduler.contract.results import (
    EventEnvelope,
    FinalEvent,
    StoredFinalEvent,
    TokenizeResult,
    TokenPiece,
)
from scheduler.hub import EventHub, HubItem
from scheduler.job_events import JobEvents
from storage.local import LocalStore
from storage.results import ResultStore
from tests.processes import Fleet
from worker.wires.result_offload import ResultOffload

pytestmark = pytest.mark.process


async def test_a_huge_tokenize_result_travels_by_the_store(tiny_fleet: Fleet,
                                                          redis_url: str) -> None:
    content = " ".join(f"w{i % 997}" for i in range(40_000))  # ~3 MB of pieces
    async with httpx.AsyncClient(base_url=tiny_fleet.api_urls[0], timeout=120) as client:
        ids = (await client.post("/tokenize", json={"content": content})).json()["tokens"]
        redis = Redis.from_url(redis_url)
        before = set(await redis.zrange(keys.stored_results(), 0, -1))
        response = await client.post("/tokenize", json={"content": content,
                                                        "with_pieces": True})
        assert response.status_code == 200, response.text
        pieces = response.json()["tokens"]
        assert [p["id"] for p in pieces] == ids  # the whole result, in order
        assert len(response.content) > keys.RESULT_INLINE_MAX_BYTES
        stored = set(await redis.zrange(keys.stored_results(), 0, -1)) - before
        assert len(stored) == 1
        key = stored.pop().decode()
        job_id = key.removeprefix("results/").removesuffix(".json")
        assert (tiny_fleet.workdir / "store" / key).is_file()
        log = await redis.xrange(keys.job_event_log(job_id))
        assert log and max(len(fields[b"e"]) for _, fields in log) < 1024  # Redis holds a key
        await redis.aclose()


async def test_the_sweep_deletes_expired_results(redis_url: str, tmp_path: Path) -> None:
    redis = Redis.from_url(redis_url)
    results = ResultStore(LocalStore(tmp_path))
    offload = ResultOffload(redis, results, inline_max=64, ttl_s=0.2)
    small = FinalEvent(result=TokenizeResult(tokens=[1, 2]))
    assert await offload.event("small", small) is small
    big = FinalEvent(result=TokenizeResult(tokens=[TokenPiece(id=i, piece="x") for i in
                                                   range(50)]))
    stored = await offload.event(f"big-{time.monotonic_ns()}", big)
    assert isinstance(stored, StoredFinalEvent) and stored.size > 64
    assert results.get(stored.key) == big.result.model_dump_json().encode()
    assert stored.key not in await offload.sweep()  # not old yet
    await asyncio.sleep(0.3)
    assert stored.key in await offload.sweep()
    assert not (tmp_path / stored.key).exists()
    assert stored.key.encode() not in await redis.zrange(keys.stored_results(), 0, -1)
    await redis.aclose()


async def test_a_swept_result_is_a_404(redis_url: str, tmp_path: Path) -> None:
    redis = Redis.from_url(redis_url)
    job = TokenizeJob(model="m", content="x")
    queue: asyncio.Queue[HubItem] = asyncio.Queue()
    queue.put_nowait(EventEnvelope(job_id=job.job_id, seq=0, event=StoredFinalEvent(
        key=f"results/{job.job_id}.json", size=10)))
    events = JobEvents(job, queue, 5, redis, EventHub(redis),
                       results=ResultStore(LocalStore(tmp_path)))
    with pytest.raises(NotFound, match="expired"):
        await events.result()
    await redis.aclose()
