"""Redis commands sent without a Task a command (scheduler/quick_send.py): every client
llamaq opens uses it, commands work, and a send that Redis does not take still times out
after the reply timeout, with redis-py's error, the connection dropped."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.connections import open_redis
from scheduler.quick_send import QuickSend, quick, quick_send


async def test_llamaq_clients_send_quickly_and_commands_work(redis_url: str) -> None:
    client = open_redis(redis_url)
    try:
        assert issubclass(client.connection_pool.connection_class, QuickSend)
        await client.set("quick-send:k", "v", ex=10)
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("quick-send:k")
            pipe.incr("quick-send:n")
            pipe.expire("quick-send:n", 10)
            got, n, _ = await pipe.execute()
        assert got == b"v" and n >= 1
    finally:
        await client.aclose()


@pytest.mark.parametrize("url, base", [("unix:///tmp/none.sock", "UnixDomainSocketConnection"),
                                       ("rediss://127.0.0.1:1", "SSLConnection")])
def test_every_kind_of_connection_keeps_its_class(url: str, base: str) -> None:
    cls = open_redis(url).connection_pool.connection_class
    assert issubclass(cls, QuickSend) and [c.__name__ for c in cls.__mro__][2] == base
    assert quick(cls) is cls  # once is enough


async def test_a_send_redis_does_not_take_times_out() -> None:
    """A peer that accepts and never reads (a frozen Redis): the write blocks once the
    socket buffers are full; the reply timeout ends it as redis-py's would."""
    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Redis(host="127.0.0.1", port=port, socket_timeout=0.3, lib_name=None,
                   lib_version=None)
    quick_send(client)
    try:
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
            await asyncio.wait_for(client.set("k", b"x" * (64 << 20)), 10)
        assert 0.25 < time.monotonic() - started < 5
    finally:
        await client.aclose()
        server.close()
