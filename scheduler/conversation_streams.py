"""Web UI conversation streams that survive a reload: llama-server's resumable streams.

llama.cpp's web UI sends `X-Conversation-Id` with a streamed chat; llama-server then keeps
every SSE byte of the answer in a per-conversation buffer, keeps generating when the browser
goes away, and a reloaded page finds it (`POST /v1/streams/lookup`) and replays it from any
byte offset (`GET /v1/stream?conv_id=&from=`) until it ends. Here the buffer is in Redis, so
that any api pod answers the replay: the pod streaming the answer appends to it (a session
token guards against a newer session of the same conversation), readers poll it. One
conversation has at most one session: a new one replaces the old, whose producer stops
writing; `DELETE /v1/stream` evicts it. A finished session lives CONVERSATION_STREAM_TTL_S.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.asyncio import Redis

from scheduler.contract import keys

SEPARATOR = "::"
"""Between a conversation id and the model of a per-model session (the UI's streamIdentity)."""
POLL_S = 0.1

APPEND = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return -1 end
local n = redis.call('APPEND', KEYS[2], ARGV[2])
if ARGV[4] ~= '0' then redis.call('HSET', KEYS[1], 'completed_at', ARGV[4]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return n
"""
"""Append bytes (and mark the end) only while the session is still this producer's."""


@dataclass(frozen=True)
class SessionInfo:
    """One entry of `POST /v1/streams/lookup`'s answer, llama-server's shape."""

    conversation_id: str
    is_done: bool
    total_bytes: int
    started_at: int
    completed_at: int

    def json(self) -> dict[str, object]:
        return {"conversation_id": self.conversation_id, "is_done": self.is_done,
                "total_bytes": self.total_bytes, "started_at": self.started_at,
                "completed_at": self.completed_at}


class ConversationStreams:
    def __init__(self, redis: Redis, tenant: str) -> None:
        self._redis = redis
        self._tenant = tenant
        self._append = redis.register_script(APPEND)

    def _keys(self, conversation_id: str) -> tuple[str, str]:
        return (keys.conversation_stream(self._tenant, conversation_id),
                keys.conversation_stream_bytes(self._tenant, conversation_id))

    async def start(self, conversation_id: str) -> str:
        """A new session for the conversation (replacing any), empty; its producer token."""
        token = uuid.uuid4().hex
        meta, data = self._keys(conversation_id)
        ttl = keys.CONVERSATION_STREAM_TTL_S
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(data)
            pipe.hset(meta, mapping={"token": token, "started_at": int(time.time()),
                                     "completed_at": 0})
            pipe.expire(meta, ttl)
            pipe.set(data, b"", ex=ttl)
            bare, sep, _ = conversation_id.partition(SEPARATOR)
            if sep:
                variants = keys.conversation_stream_variants(self._tenant, bare)
                pipe.sadd(variants, conversation_id)
                pipe.expire(variants, ttl)
            await pipe.execute()
        return token

    async def append(self, conversation_id: str, token: str, data: bytes,
                     done: bool = False) -> bool:
        """Append the session's next bytes (and end it); False once it is no longer ours."""
        ended = int(time.time()) if done else 0
        result = await self._append(keys=list(self._keys(conversation_id)),
                                    args=[token, data, keys.CONVERSATION_STREAM_TTL_S, ended])
        return int(result) >= 0

    async def evict(self, conversation_id: str) -> None:
        """The UI's Stop: the session is gone (its producer writes no more)."""
        await self._redis.delete(*self._keys(conversation_id))

    async def info(self, conversation_id: str) -> SessionInfo | None:
        meta, data = self._keys(conversation_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(meta)
            pipe.strlen(data)
            fields, size = await pipe.execute()
        if not fields or b"token" not in fields:
            return None
        completed = int(fields.get(b"completed_at", b"0"))
        return SessionInfo(conversation_id=conversation_id, is_done=completed != 0,
                           total_bytes=int(size), started_at=int(fields.get(b"started_at", 0)),
                           completed_at=completed)

    async def lookup(self, conversation_ids: list[str]) -> list[SessionInfo]:
        """The sessions of the ids asked about: each id and its `<id>::<model>` variants."""
        found: list[SessionInfo] = []
        for asked in conversation_ids:
            variants: set[bytes] = await self._redis.smembers(  # type: ignore[misc]
                keys.conversation_stream_variants(self._tenant, asked))
            for name in [asked, *sorted(v.decode() for v in variants)]:
                info = await self.info(name)
                if info is not None:
                    found.append(info)
        return found

    async def read(self, conversation_id: str, offset: int) -> AsyncIterator[bytes]:
        """The session's bytes from `offset`, then each new one, until it ends, is evicted or
        is replaced by a newer session."""
        meta, data = self._keys(conversation_id)
        token = await self._redis.hget(meta, "token")  # type: ignore[misc]
        while token is not None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(meta, ["token", "completed_at"])
                pipe.getrange(data, offset, -1)
                (now_token, completed), chunk = await pipe.execute()
            if chunk:
                offset += len(chunk)
                yield bytes(chunk)
                continue
            if now_token != token or completed is None or int(completed) != 0:
                return
            await asyncio.sleep(POLL_S)
