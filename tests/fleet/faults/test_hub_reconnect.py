"""The event hub's one pub/sub connection comes back while requests subscribe: only the hub's
reader reconnects it. When a subscribing request reconnected it too, both read its socket
together (redis-py's on_connect reads its CLIENT SETINFO replies), and asyncio raised
RuntimeError in one of them: a 500 for the request, or a dead reader and a restarted pod (seen
in a Sentinel failover under load). A slow link (every reply delayed) widens that moment from
microseconds to many milliseconds, so the test sees it every time (real Redis, the api's hub)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.contract.errors import LlamaqError
from scheduler.contract.results import EventEnvelope, StartedEvent
from scheduler.hub import INLINE, EventHub, Resync
from tests.proxy import pipe

REPLY_DELAY_S = 0.02


@contextlib.asynccontextmanager
async def slow_link(redis_url: str) -> AsyncIterator[str]:
    """A TCP proxy to the Redis of `redis_url` that delays every reply by REPLY_DELAY_S."""
    host, port = redis_url.split("//")[1].split("/")[0].split(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer, REPLY_DELAY_S))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    finally:
        server.close()


async def test_requests_subscribing_while_the_hub_reconnects_get_their_events(
        redis_url: str) -> None:
    """The hub's connection drops; requests subscribe every 5 ms from just before the reader
    reconnects (it waits RECONNECT_DELAY_S) until after: each one hears its job's events or
    is refused with a retryable error, and the reader lives on."""
    admin = open_redis(redis_url)
    async with slow_link(redis_url) as url:
        redis = open_redis(url)
        hub = EventHub(redis)
        await hub.start()
        try:
            for wait_s in (0.40, 0.44, 0.46, 0.47, 0.48, 0.49, 0.50):
                await admin.client_kill_filter(_type="pubsub")  # the hub's connection drops
                await asyncio.sleep(wait_s)
                subscribing = []
                for n in range(40):
                    subscribing.append(asyncio.ensure_future(asyncio.wait_for(
                        _hears_its_events(hub, admin, f"race-{n}"), 10)))
                    await asyncio.sleep(0.005)
                outcomes = await asyncio.gather(*subscribing, return_exceptions=True)
                unexpected = [o for o in outcomes if o is not True
                              and not isinstance(o, (LlamaqError, RedisError))]
                assert unexpected == []
                assert outcomes.count(True) >= 30
                assert not hub.reader.done()
            assert await _hears_its_events(hub, admin, "after")
        finally:
            await hub.close()
            await redis.aclose()
            await admin.aclose()


async def _hears_its_events(hub: EventHub, admin: Redis, job_id: str) -> bool:
    """Subscribe to the job's events, publish one as a worker does, and see it arrive."""
    envelope = EventEnvelope(job_id=job_id, seq=0, event=StartedEvent())
    async with hub.subscription(job_id) as queue:
        await admin.publish(keys.job_events(job_id),
                            bytes([INLINE]) + envelope.model_dump_json().encode())
        item = await asyncio.wait_for(queue.get(), 5)
        while isinstance(item, Resync):  # the reader came back while this one waited
            item = await asyncio.wait_for(queue.get(), 5)
        return item == envelope
