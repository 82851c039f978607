"""Fan-in of job events for one api process: one pub/sub connection, one queue per waiting job."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from scheduler import keys
from scheduler.results import ENVELOPE, EventEnvelope

log = logging.getLogger(__name__)


class EventHub:
    """Subscribes per job on a shared connection and waits for Redis to confirm each subscription,
    so that an enqueue that follows can never publish into the void."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._queues: dict[str, asyncio.Queue[EventEnvelope]] = {}
        self._confirmations: dict[str, asyncio.Future[None]] = {}

    async def start(self) -> None:
        self._pubsub = self._redis.pubsub()
        # A channel of our own keeps the connection subscribed while no job is waiting.
        await self._pubsub.subscribe(f"{keys.PREFIX}:hub:{uuid.uuid4().hex}")
        self._reader = asyncio.create_task(self._read_forever(self._pubsub))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            await self._pubsub.aclose()

    @contextlib.asynccontextmanager
    async def subscription(self, job_id: str) -> AsyncIterator[asyncio.Queue[EventEnvelope]]:
        assert self._pubsub is not None, "EventHub.start() was not awaited"
        channel = keys.job_events(job_id)
        queue: asyncio.Queue[EventEnvelope] = asyncio.Queue()
        confirmed = asyncio.get_running_loop().create_future()
        self._queues[channel] = queue
        self._confirmations[channel] = confirmed
        try:
            await self._pubsub.subscribe(channel)
            await confirmed
            yield queue
        finally:
            self._queues.pop(channel, None)
            self._confirmations.pop(channel, None)
            with contextlib.suppress(RedisError):
                await self._pubsub.unsubscribe(channel)

    async def _read_forever(self, pubsub: PubSub) -> None:
        while True:
            try:
                message = await pubsub.get_message(timeout=None)
            except RedisError:
                log.exception("event hub lost its Redis connection; reconnecting")
                await asyncio.sleep(0.2)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, object]) -> None:
        channel = _text(message["channel"])
        if message["type"] == "subscribe":
            confirmed = self._confirmations.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
            return
        if message["type"] != "message":
            return
        queue = self._queues.get(channel)
        if queue is None:
            return
        try:
            queue.put_nowait(ENVELOPE.validate_json(message["data"]))  # type: ignore[arg-type]
        except ValidationError:
            log.exception("malformed event on %s", channel)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
