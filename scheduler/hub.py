"""Fan-in of job events for one api process: one pub/sub connection, one queue per waiting job.

Pub/sub announces events (inline, or as a pointer to the job's event log when big); the log
(a capped Redis stream per job) is where missed events are read back. The hub reconnects by
itself and resubscribes. Cut from Redis for longer than HUB_GRACE_S, it ends every waiting job
with a retryable error; back on a Redis that lost its data (a new epoch), it ends them at once
(their jobs are gone); back within the grace on the same data, the jobs read back from their
logs what they missed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from scheduler.contract import event_keys, keys
from scheduler.contract.errors import LlamaqError, RedisUnreachable
from scheduler.contract.results import ENVELOPE, EventEnvelope
from scheduler.pubsub_watch import WatchedPubSub, connected

log = logging.getLogger(__name__)

DROPPED_MEANWHILE = (AttributeError,)
"""What redis-py raises when the reader drops the shared connection while a (un)subscribe is
on its way (its writer is None then: `'NoneType' object has no attribute 'writelines'`): a
lost Redis, not a bug of the request (it was a 500 in test_sentinel_failover_under_load)."""
RECONNECT_DELAY_S = 0.5
CONNECTED_POLL_S = 0.05
"""How often a subscription that waits for the reader to reconnect looks again."""
INLINE = ord("E")
POINTER = ord("R")
BATCH = b"B"
"""The tag of a worker's flush on a pod's channel (several jobs' announcements)."""


@dataclass(frozen=True)
class EventPointer:
    """An event too big for pub/sub: read it from the job's event log."""

    seq: int


@dataclass(frozen=True)
class Resync:
    """The hub was cut from Redis for a moment: read back from the log what was missed."""


RESYNC = Resync()
HubItem = EventEnvelope | EventPointer | Resync | LlamaqError


class EventQueue(asyncio.Queue[HubItem]):
    """A job's queue of hub items, whose one reader may wait for the next with a deadline
    (`next_within`) at the cost of a future and a timer, not of an asyncio.timeout context per
    wait (issue 44: ~4 us of the api's CPU per streamed token)."""

    def __init__(self) -> None:
        super().__init__()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: HubItem) -> None:
        super().put_nowait(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get_within(self, timeout_s: float) -> HubItem | None:
        """The next item; None when none came within `timeout_s`."""
        if self.empty():
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                timer.cancel()
            if self.empty():
                return None
        return self.get_nowait()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def next_within(queue: asyncio.Queue[HubItem], timeout_s: float) -> HubItem | None:
    """The queue's next item; None when none came within `timeout_s`."""
    if isinstance(queue, EventQueue):
        return await queue.get_within(timeout_s)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    return None


class EventHub:
    """Subscribes per job on a shared connection and waits for Redis to confirm each subscription,
    so that an enqueue that follows can never publish into the void."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._queues: dict[str, asyncio.Queue[HubItem]] = {}
        self._confirmations: dict[str, asyncio.Future[None]] = {}
        self._epoch = ""
        self._stale: set[str] = set()
        """Channels whose unsubscribe failed (Redis was away): dropped after a reconnect."""
        self._background: set[asyncio.Task[None]] = set()
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []
        self._heard = False
        """The reader heard Redis on the connection since it last (re)connected it."""
        self.channel = ""
        """This pod's own channel: workers announce the events of the jobs it queued there,
        a flush's in one message (worker/wires/fenced_write.py; "" until `start`)."""

    @property
    def reader(self) -> asyncio.Task[None]:
        assert self._reader is not None, "EventHub.start() was not awaited"
        return self._reader

    async def start(self) -> None:
        self._epoch = await self._read_epoch()
        self._pubsub = self._redis.pubsub()
        # A channel of our own keeps the connection subscribed while no job is waiting, and
        # brings the events of the jobs this pod queued (CompletionJob.reply_to).
        self.channel = event_keys.pod_events(uuid.uuid4().hex)
        await self._pubsub.subscribe(self.channel)
        self._reader = asyncio.create_task(self._read_forever(self._pubsub))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(RedisError):
                await self._pubsub.aclose()

    @contextlib.asynccontextmanager
    async def subscription(self, job_id: str, confirm: bool = True
                           ) -> AsyncIterator[asyncio.Queue[HubItem]]:
        """The job's events, from the moment Redis confirmed the subscription to its channel.
        `confirm` False: a job whose workers announce its events on this pod's channel
        (`channel`, subscribed since `start`: a job this pod queued with it as `reply_to`)
        needs no wait for the confirmation, which comes after every message the reader has
        yet to read (under load, the other streams' tokens: issue 47, a priority 0 request's
        time to first token); its own channel only brings what a worker writes without its
        lease (rare: a job given up while Redis was away), which the job's silent checks read
        back from its log."""
        assert self._pubsub is not None, "EventHub.start() was not awaited"
        channel = keys.job_events(job_id)
        queue: asyncio.Queue[HubItem] = EventQueue()
        confirmed = asyncio.get_running_loop().create_future()
        self._queues[channel] = queue
        self._confirmations[channel] = confirmed
        try:
            await self._until_connected()
            try:
                await self._pubsub.subscribe(channel)
            except DROPPED_MEANWHILE:
                raise RedisUnreachable() from None
            if confirm:
                await confirmed
            yield queue
        finally:
            self._queues.pop(channel, None)
            self._confirmations.pop(channel, None)
            try:
                if self._connected():  # else see _until_connected
                    await self._pubsub.unsubscribe(channel)
                else:
                    self._stale.add(channel)
            except (RedisError, *DROPPED_MEANWHILE):
                self._stale.add(channel)

    async def _until_connected(self) -> None:
        """Only the reader (re)connects the shared connection. A subscription that connected
        it would read its socket beside the reader (redis-py's on_connect reads replies), and
        asyncio raises RuntimeError in the second of them: a 500 for the request, or a dead
        reader. So a subscription waits for the reader, up to HUB_GRACE_S (then 503)."""
        deadline = time.monotonic() + keys.HUB_GRACE_S
        while not self._connected():
            if time.monotonic() >= deadline:
                raise RedisUnreachable()
            await asyncio.sleep(CONNECTED_POLL_S)

    def _connected(self) -> bool:
        """Whether the connection is up and done connecting. A socket is not enough: while
        redis-py's on_connect sends its CLIENT SETINFO pair (each send yields, with a reply
        timeout), a SUBSCRIBE sent between them has its reply read as theirs, and the reader
        reads the second SETINFO reply as an error (a lost Redis). The reader hearing anything
        on the connection (a message, a confirmation, a pong) means it connected whole."""
        assert self._pubsub is not None
        return self._heard and connected(self._pubsub)

    async def read_log(self, job_id: str, first_seq: int,
                       last_seq: int | None = None) -> list[EventEnvelope]:
        """Events of the job's log from `first_seq` (to `last_seq`, included), in order."""
        end = "+" if last_seq is None else f"0-{last_seq + 1}"
        entries = await self._redis.xrange(keys.job_event_log(job_id), f"0-{first_seq + 1}",
                                           end)
        return [ENVELOPE.validate_json(fields[b"e"]) for _, fields in entries]

    async def read_last(self, job_id: str, count: int) -> list[EventEnvelope]:
        """The last `count` events of the job's log, newest first."""
        entries = await self._redis.xrevrange(keys.job_event_log(job_id), count=count)
        return [ENVELOPE.validate_json(fields[b"e"]) for _, fields in entries]

    async def _read_forever(self, pubsub: PubSub) -> None:
        lost_at: float | None = None
        lost_with: set[str] = set()  # the jobs waiting when Redis went away
        failed = False
        watched = WatchedPubSub(pubsub)
        while True:
            try:
                message = await watched.get_message()
            except (RedisError, TimeoutError) as error:
                self._heard = False
                if lost_at is None:  # a frozen Redis: lost since it was last heard
                    silent = isinstance(error, RedisTimeoutError)
                    lost_at = watched.heard if silent else time.monotonic()
                    lost_with = set(self._queues)
                    log.error("event hub lost Redis (%s); reconnecting", error)
                if not failed and time.monotonic() - lost_at >= keys.HUB_GRACE_S:
                    failed = True
                    self._fail_all("lost the connection to the job queue (Redis)")
                self._fail_confirmations()
                await asyncio.sleep(RECONNECT_DELAY_S)
                watched.restart()
                continue
            if message is None:  # nothing yet: while lost, no proof that Redis answers
                continue
            self._heard = True
            if lost_at is not None:
                log.warning("event hub reconnected to Redis after %.1f s",
                            time.monotonic() - lost_at)
                lost_at, failed = None, False
                task = asyncio.create_task(self._after_reconnect(pubsub, lost_with))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            self._dispatch(message)

    def _fail_all(self, message: str, only: set[str] | None = None) -> None:
        """Whatever was on its way may be lost (and the jobs may be gone with Redis's data), so
        every waiting job (of `only`, when given) ends now with a retryable error (and is
        cancelled by its client)."""
        queues = [queue for channel, queue in self._queues.items()
                  if only is None or channel in only]
        log.error("event hub: ending %d waiting jobs: %s", len(queues), message)
        for queue in queues:
            queue.put_nowait(RedisUnreachable(message))

    def _fail_confirmations(self) -> None:
        for future in self._confirmations.values():
            if not future.done():
                future.set_exception(RedisUnreachable())

    async def _read_epoch(self) -> str:
        """Redis's data epoch (set once; a new one means Redis lost its data)."""
        fresh = uuid.uuid4().hex
        await self._redis.set(keys.EPOCH, fresh, nx=True)
        epoch = await self._redis.get(keys.EPOCH)
        return fresh if epoch is None else _text(epoch)

    async def _after_reconnect(self, pubsub: PubSub, lost_with: set[str]) -> None:
        """Back on Redis: if it lost its data, the jobs that were waiting when it went away
        (`lost_with`) are gone -- not those submitted since, to the Redis that came back (the
        hub may only notice the reconnection when such a job subscribes); else every waiting
        job reads back from its log what pub/sub did not bring meanwhile."""
        stale, self._stale = self._stale - set(self._queues), set()
        try:
            epoch = await self._read_epoch()
            if epoch != self._epoch:
                self._epoch = epoch
                self._fail_all("the job queue (Redis) restarted and lost this request",
                               only=lost_with)
            else:
                for queue in self._queues.values():
                    queue.put_nowait(RESYNC)
            if stale and self._connected():  # else they stay stale (see _until_connected)
                await pubsub.unsubscribe(*stale)
            elif stale:
                self._stale |= stale
            for callback in self.on_reconnect:
                await callback()
        except RedisError as error:
            log.warning("event hub: clean-up after reconnecting failed (%s)", error)

    def _dispatch(self, message: dict[str, object]) -> None:
        if message["type"] not in ("subscribe", "message"):
            return  # a pong (the reader's health check), an unsubscribe
        channel = _text(message["channel"])
        if message["type"] == "subscribe":
            confirmed = self._confirmations.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
            return
        if message["type"] != "message":
            return
        data = message["data"]
        assert isinstance(data, bytes)
        if channel == self.channel:
            self._dispatch_batch(data)
            return
        self._announced(channel, data)

    def _dispatch_batch(self, data: bytes) -> None:
        """A worker's flush of the events of this pod's jobs: 'B', then per event "<job id>
        <length> <announcement>" (worker/wires/fenced_write.py)."""
        try:
            if data[:1] != BATCH:
                raise ValueError("not a batch")
            at = 1
            while at < len(data):
                space = data.index(b" ", at)
                length_end = data.index(b" ", space + 1)
                end = length_end + 1 + int(data[space + 1:length_end])
                if end > len(data):
                    raise ValueError("a cut batch")
                job_id = data[at:space].decode()
                self._announced(keys.job_events(job_id), data[length_end + 1:end])
                at = end
        except (ValueError, UnicodeDecodeError):  # junk anyone may publish
            log.exception("malformed batch of events on %s", self.channel)

    def _announced(self, channel: str, data: bytes) -> None:
        """One event's announcement (inline or a pointer) for the job of `channel`."""
        queue = self._queues.get(channel)
        if queue is None:
            return
        try:
            if data[0] == POINTER:
                queue.put_nowait(EventPointer(int(data[1:])))
            else:
                queue.put_nowait(ENVELOPE.validate_json(data[1:] if data[0] == INLINE else data))
        except (ValidationError, ValueError, IndexError):  # junk anyone may publish
            log.exception("malformed event on %s", channel)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
