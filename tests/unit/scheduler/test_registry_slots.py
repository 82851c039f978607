"""A worker's slot states as /slots reads them: written with the JSON of unchanged states
kept between writes (issue 44), the stored body is the same as encoding each state afresh,
and a slot whose state object changed is encoded again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.registry import SlotState, write_slots


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def written(redis: Redis, worker_id: str, slots: list[SlotState],
                  bodies: dict[int, tuple[SlotState, str]] | None) -> list[dict[str, object]]:
    pipe = redis.pipeline(transaction=False)
    write_slots(pipe, worker_id, slots, bodies)
    await pipe.execute()
    raw = await redis.get(keys.worker_slots(worker_id))
    assert raw is not None
    return list(json.loads(raw))


async def test_kept_bodies_are_reused_only_for_the_same_state(redis: Redis) -> None:
    idle = SlotState(id=0, n_ctx=64, is_processing=False, id_task=3, simulated=True)
    busy = SlotState(id=1, n_ctx=64, is_processing=True, id_task=4)
    bodies: dict[int, tuple[SlotState, str]] = {}
    first = await written(redis, "slots-w1", [idle, busy], bodies)
    assert first == await written(redis, "slots-w2", [idle, busy], None)
    kept = bodies[0][1]
    ended = SlotState(id=1, n_ctx=64, is_processing=False, id_task=4)
    second = await written(redis, "slots-w1", [idle, ended], bodies)
    assert second[1]["is_processing"] is False and second[0] == first[0]
    assert bodies[0][1] is kept and bodies[1][0] is ended
    assert second == await written(redis, "slots-w2", [idle, ended], None)
