"""Records of streamed responses, so that any api pod can resume one from an SSE event id.

A record names the response's jobs (whose events stay in their event logs for a bounded time)
and the ids the first pod minted for it (OpenAI `id`/`created`, Anthropic message id), so that
a resumed stream is the same stream. Its `holder` is the connection now streaming it: a pod
whose client went away cancels the jobs after a grace period only if nobody resumed."""

from __future__ import annotations

import uuid

from pydantic import Field
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import NotFound


class StreamRecord(DeferredModel):
    record_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:20])
    route: str
    job_ids: list[str] = Field(default_factory=list)
    minted: dict[str, str | int] = Field(default_factory=dict)
    tenant: str = "default"
    """Who may resume or stop it (--tenants; another tenant gets 404)."""
    conversation: str | None = None
    """The web UI's `X-Conversation-Id` of the request, if any (DELETE /v1/stream stops it)."""


class EventId(DeferredModel):
    """`<record id>-<n0>.<n1>…<tail>`: how many SSE events of each job (and of the tail
    after all jobs ended) the client has."""

    record_id: str
    counts: list[int]

    def text(self) -> str:
        return event_id_text(self.record_id, self.counts)

    @classmethod
    def parse(cls, text: str) -> EventId:
        record_id, _, counts = text.strip().partition("-")
        try:
            numbers = [int(n) for n in counts.split(".")]
        except ValueError:
            numbers = []
        if not record_id or not numbers or min(numbers) < 0:
            raise NotFound(f"unknown or expired Last-Event-ID {text!r}")
        return cls(record_id=record_id, counts=numbers)


def event_id_text(record_id: str, counts: list[int]) -> str:
    """An `EventId`'s text, without building one (a streamed event's id: issue 44)."""
    return f"{record_id}-{'.'.join(map(str, counts))}"


class StreamRecords:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def save(self, record: StreamRecord, holder: str) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.stream_record(record.record_id), record.model_dump_json(),
                     ex=keys.EVENT_LOG_TTL_S)
            pipe.set(keys.stream_holder(record.record_id), holder, ex=keys.EVENT_LOG_TTL_S)
            if record.conversation:
                pipe.set(keys.stream_conversation(record.tenant, record.conversation),
                         record.record_id, ex=keys.EVENT_LOG_TTL_S)
            await pipe.execute()

    async def of_conversation(self, tenant: str, conversation_id: str) -> StreamRecord | None:
        """The newest streamed response of a web UI conversation, if one is recorded."""
        record_id = await self._redis.get(keys.stream_conversation(tenant, conversation_id))
        if record_id is None:
            return None
        body = await self._redis.get(keys.stream_record(record_id.decode()))
        return None if body is None else StreamRecord.model_validate_json(body)

    async def load(self, event_id: EventId, route: str) -> StreamRecord:
        """The record an event id names; 404 when unknown, expired or of another endpoint."""
        body = await self._redis.get(keys.stream_record(event_id.record_id))
        record = None if body is None else StreamRecord.model_validate_json(body)
        if record is None or record.route != route or not record.job_ids or \
                len(event_id.counts) != len(record.job_ids) + 1:
            raise NotFound(f"unknown or expired Last-Event-ID {event_id.text()!r}")
        return record

    async def holder(self, record_id: str) -> str | None:
        holder = await self._redis.get(keys.stream_holder(record_id))
        return None if holder is None else holder.decode()

    async def job_ids(self, record_id: str) -> list[str]:
        """The jobs of a streamed response; 404 when the record is unknown or expired."""
        return (await self.record(record_id)).job_ids

    async def record(self, record_id: str) -> StreamRecord:
        """A streamed response's record; 404 when unknown or expired."""
        body = await self._redis.get(keys.stream_record(record_id))
        if body is None:
            raise NotFound(f"unknown or expired stream {record_id!r}")
        return StreamRecord.model_validate_json(body)
