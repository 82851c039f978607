"""A job's queue of hub items and its reader's wait with a deadline (scheduler/hub.py
EventQueue, next_within): what asyncio.timeout around Queue.get gave, cheaper (issue 44); a
subscription whose connection the reader drops meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler.contract import keys
from scheduler.contract.errors import RedisUnreachable
from scheduler.hub import RESYNC, EventHub, EventPointer, EventQueue, HubItem, next_within


async def test_an_item_already_queued_comes_at_once() -> None:
    queue = EventQueue()
    queue.put_nowait(EventPointer(3))
    assert await queue.get_within(10) == EventPointer(3)
    assert queue.empty()


async def test_an_item_put_while_waiting_wakes_the_reader() -> None:
    queue = EventQueue()
    asyncio.get_running_loop().call_later(0.05, queue.put_nowait, RESYNC)
    start = time.monotonic()
    assert await queue.get_within(10) is RESYNC
    assert time.monotonic() - start < 5


async def test_nothing_within_the_deadline_is_none_and_leaves_no_waiter() -> None:
    queue = EventQueue()
    start = time.monotonic()
    assert await queue.get_within(0.05) is None
    assert time.monotonic() - start >= 0.04
    queue.put_nowait(EventPointer(1))  # nobody waits: it stays queued
    assert queue.get_nowait() == EventPointer(1)


async def test_a_cancelled_reader_takes_nothing() -> None:
    queue = EventQueue()
    reader = asyncio.ensure_future(queue.get_within(10))
    await asyncio.sleep(0.01)
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    queue.put_nowait(EventPointer(2))
    assert queue.get_nowait() == EventPointer(2)


async def test_items_keep_their_order_and_a_plain_queue_still_works() -> None:
    queue = EventQueue()
    for seq in range(3):
        queue.put_nowait(EventPointer(seq))
    assert [await queue.get_within(1) for _ in range(3)] == [EventPointer(s) for s in range(3)]
    plain: asyncio.Queue[HubItem] = asyncio.Queue()
    assert await next_within(plain, 0.01) is None
    plain.put_nowait(RESYNC)
    assert await next_within(plain, 1) is RESYNC
    assert await next_within(EventQueue(), 0.01) is None


class DroppingPubSub:
    """redis-py's PubSub as it behaves when the hub's reader drops its connection while a
    (un)subscribe is on its way: the connection's writer is None."""

    def __init__(self, fail_subscribe: bool = False) -> None:
        self.connection = type("Connection", (), {"is_connected": True})()
        self.fail_subscribe = fail_subscribe

    async def subscribe(self, *channels: str) -> None:
        if self.fail_subscribe:
            raise AttributeError("'NoneType' object has no attribute 'writelines'")

    async def unsubscribe(self, *channels: str) -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")


def dropping_hub(fail_subscribe: bool = False) -> EventHub:
    hub = EventHub(cast(Redis, None))
    hub._pubsub = cast(PubSub, DroppingPubSub(fail_subscribe))
    hub._heard = True
    return hub


async def test_a_connection_dropped_under_an_unsubscribe_keeps_the_requests_own_error() -> None:
    """The enqueue failed (Redis went away) and the reader dropped the connection under the
    unsubscribe: the request ends with its own error (a 503), not redis-py's AttributeError
    (a 500), and the channel is unsubscribed after the reconnection."""
    hub = dropping_hub()
    with pytest.raises(RedisConnectionError):
        async with hub.subscription("job1", confirm=False):
            raise RedisConnectionError("Connection reset by peer")
    assert hub._stale == {keys.job_events("job1")}
    async with hub.subscription("job2", confirm=False):
        pass  # a clean exit too
    assert keys.job_events("job2") in hub._stale


async def test_a_connection_dropped_under_a_subscribe_is_a_lost_redis() -> None:
    with pytest.raises(RedisUnreachable):
        async with dropping_hub(fail_subscribe=True).subscription("job1", confirm=False):
            pass
