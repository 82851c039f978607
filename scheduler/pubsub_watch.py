"""Reading a pub/sub connection so that a frozen Redis (SIGSTOP, a partition: its socket stays
open and nothing answers) is noticed: poll instead of blocking, ping, and drop a connection
that stays silent. The api's event hub and the worker's listener read through it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from redis.asyncio.client import PubSub
from redis.exceptions import TimeoutError as RedisTimeoutError

POLL_S = 0.5
"""The reader waits this long for a message, then looks at the connection's health."""
PING_EVERY_S = 1.0
SILENT_S = 3.0
"""No message nor pong for this long: Redis is frozen though its socket is open; the
connection is dropped and treated as lost."""


class WatchedPubSub:
    def __init__(self, pubsub: PubSub, ping_every_s: float = PING_EVERY_S,
                 silent_s: float = SILENT_S) -> None:
        self.pubsub = pubsub
        self.ping_every_s, self.silent_s = ping_every_s, silent_s
        self.heard = self._pinged = time.monotonic()
        """When Redis was last heard on this connection (a message or a pong)."""

    def restart(self) -> None:
        """A new connection gets its own `silent_s`."""
        self.heard = self._pinged = time.monotonic()

    async def get_message(self) -> dict[str, Any] | None:
        """The next message (a pong included), None after POLL_S without one. Raises redis'
        TimeoutError, the connection dropped, when Redis was silent for `silent_s`, and
        TimeoutError when a ping cannot be sent within POLL_S."""
        message = await self.pubsub.get_message(timeout=POLL_S)
        now = time.monotonic()
        if message is not None:
            self.heard = now
        elif now - self.heard >= self.silent_s:
            await drop(self.pubsub)
            raise RedisTimeoutError(f"no answer from Redis for {self.silent_s:g} s")
        if now - self._pinged >= self.ping_every_s:
            self._pinged = now
            await asyncio.wait_for(self.pubsub.ping(), POLL_S)  # its pong is a message
        return message


def connected(pubsub: PubSub) -> bool:
    """Whether the subscription's connection has a socket (sending on it connects nothing)."""
    return pubsub.connection is not None and pubsub.connection.is_connected


async def drop(pubsub: PubSub) -> None:
    """Close the subscription's connection (it reconnects and resubscribes on next use)."""
    if pubsub.connection is not None:
        with contextlib.suppress(Exception):
            await pubsub.connection.disconnect(nowait=True)
