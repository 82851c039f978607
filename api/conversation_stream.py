"""A web UI conversation's streamed answer, as llama-server streams it (its resumable streams).

A streamed request with `X-Conversation-Id` (llama.cpp's web UI sends one with every chat)
starts the conversation's session (scheduler/conversation_streams.py): every byte of the
response also goes to its replay buffer, and the answer goes on to its end when the client
leaves, so that a reloaded page reattaches (`GET /v1/stream?conv_id=&from=`) and reads it to
the end; `DELETE /v1/stream` stops it. The buffer's writes are coalesced: one Redis call
carries every byte queued while the previous one ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from redis.exceptions import RedisError
from sanic import Request
from sanic.exceptions import RequestCancelled
from sanic.response import HTTPResponse

from api.services import services
from scheduler.conversation_streams import ConversationStreams

log = logging.getLogger(__name__)
HEADER = "X-Conversation-Id"


class StreamOut(Protocol):
    """Where a streamed response's bytes go: the HTTP response, or a `TeeStream`."""

    async def send(self, data: str = ...) -> Any: ...

    async def eof(self) -> Any: ...


def conversation_of(request: Request) -> str | None:
    """The conversation whose session a new streamed response starts (not a resume)."""
    if request.headers.get("Last-Event-ID"):
        return None
    return request.headers.get(HEADER) or None


class TeeStream:
    """The response, and the conversation's replay buffer; the client leaving stops only
    the former."""

    def __init__(self, response: HTTPResponse, sessions: ConversationStreams,
                 conversation_id: str, token: str) -> None:
        self._response = response
        self._sessions = sessions
        self._conversation = conversation_id
        self._token = token
        self._pending = bytearray()
        self._flusher: asyncio.Task[None] | None = None
        self._ours = True
        self.client_gone = False

    async def send(self, data: str = "") -> None:
        if data:
            self._pending += data.encode()
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush())
        if self.client_gone:
            return
        try:
            await self._response.send(data)
        except RequestCancelled:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self.client_gone = True
        except Exception:  # the response is closed (SanicException) or its socket is gone
            self.client_gone = True

    async def eof(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        if self._ours:
            try:
                await self._sessions.append(self._conversation, self._token,
                                            bytes(self._pending), done=True)
            except RedisError as exc:
                log.warning("conversation %s: its end not recorded: %r", self._conversation, exc)
        self._pending.clear()
        if not self.client_gone:
            with contextlib.suppress(RequestCancelled, Exception):
                await self._response.eof()

    async def _flush(self) -> None:
        while self._pending and self._ours:
            chunk = bytes(self._pending)
            self._pending.clear()
            try:
                self._ours = await self._sessions.append(self._conversation, self._token, chunk)
            except RedisError as exc:
                log.warning("conversation %s: replay buffer not written: %r",
                            self._conversation, exc)


async def tee(request: Request, response: HTTPResponse) -> StreamOut:
    """The response itself, or (a new stream of a web UI conversation) its `TeeStream`."""
    conversation = conversation_of(request)
    if conversation is None:
        return response
    sessions = ConversationStreams(services(request).fleet.redis, request.ctx.tenant.name)
    token = await sessions.start(conversation)
    return TeeStream(response, sessions, conversation, token)


async def outlive_client(request: Request, work: Coroutine[Any, Any, None]) -> None:
    """Run a web UI conversation's stream so that it goes on when the client leaves (its
    handler is cancelled then); any other stream runs as the handler."""
    if conversation_of(request) is None:
        await work
        return
    tasks: set[asyncio.Task[None]] | None = getattr(request.app.ctx, "conversation_tasks", None)
    if tasks is None:
        tasks = set()
        request.app.ctx.conversation_tasks = tasks
    task = asyncio.create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    task.add_done_callback(_log_failure)
    await asyncio.shield(task)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:  # retrieved: the handler's
        log.debug("a conversation's stream ended with %r", task.exception())
