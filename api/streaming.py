"""The SSE loop every streaming endpoint shares: jobs' events → rendered SSE events.

- The stream's headers go out when a slot takes a job (its `started` event), as llama-server
  does; an error before that is a plain JSON error response with its own status.
- While the stream is open and silent, a `: ping` comment goes out every `sse_ping_interval`
  seconds (the flag, or the request's field; <= 0 disables them).
- Every event carries an `id:` from which any api pod can resume the response: a client that
  re-sends its request with `Last-Event-ID` gets the rest, from the jobs' event logs, without a
  new job. Renderers keep per-job state only, so replaying a job's events from its first one
  rebuilds the same SSE events; the id counts how many of each job's the client has.
- A request held for a model with no live worker (api/cold_start.py) opens its stream at once
  and gets `: waiting for a worker` comments until its first event; an error then (no worker
  by --cold-start-timeout) is the stream's error event.
- A client that goes away leaves its jobs running for RESUME_GRACE_S, then they are cancelled
  unless another connection resumed the stream.
- A web UI conversation's stream (`X-Conversation-Id`) also goes to the conversation's replay
  buffer and runs to its end when the client leaves (api/conversation_stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from sanic import Request
from sanic.response import HTTPResponse

from api.cold_start import COMMENT as COLD_COMMENT
from api.cold_start import COMMENT_EVERY_S
from api.conversation_stream import StreamOut, outlive_client, tee
from api.errors import as_llamaq_error, sse_error
from api.fleet import Fleet
from api.services import services
from api.sse import open_stream
from scheduler.contract.errors import LlamaqError
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import FinalEvent, StartedEvent, TokenEvent
from scheduler.job_events import ChoiceEvent, JobEvents, merge_events
from scheduler.streams import EventId, StreamRecord, StreamRecords, event_id_text

PING = ": ping\n\n"
PING_EARLY_S = 0.005
"""A ping timer may fire this early (the loop's clock resolution)."""
Render = Callable[[int, TokenEvent | FinalEvent], Iterable[str] | Awaitable[Iterable[str]]]
"""A job's event (with the job's index) → framed SSE events, each ending with a blank line."""


@dataclass
class StreamFormat:
    render: Render
    end: Callable[[], Iterable[str]] = tuple
    """Events after every job ended (e.g. a usage chunk)."""
    terminator: str = ""
    error: Callable[[LlamaqError], str] = sse_error


@dataclass
class Resume:
    """This stream's record: a new one, or the one a `Last-Event-ID` named."""

    record: StreamRecord
    have: list[int] | None = None
    """Per job (then the tail): how many SSE events the client already has; None: new."""
    holder: str = field(default_factory=lambda: uuid.uuid4().hex)


async def early_comment(request: Request) -> None:
    """A request that waits for a worker before its jobs exist (a chat, api/cold_start.py):
    its stream opens now, with a waiting comment; `open_stream_once` hands it on."""
    response = getattr(request.ctx, "early_stream", None)
    if response is None:
        response = await tee(request, await open_stream(request))
        request.ctx.early_stream = response
    await response.send(COLD_COMMENT)


async def open_stream_once(request: Request) -> StreamOut:
    """The stream `early_comment` opened, else a new one."""
    response = getattr(request.ctx, "early_stream", None)
    return response if response is not None else await tee(request, await open_stream(request))


async def early_stream_error(request: Request, error: LlamaqError,
                             fmt: Callable[[LlamaqError], str] = sse_error) -> bool:
    """An error of a request whose stream opened early goes out as its error event (True);
    False: no stream is open, the error is a plain response."""
    response = getattr(request.ctx, "early_stream", None)
    if response is None:
        return False
    await response.send(fmt(error))
    await response.eof()
    return True


Handler = Callable[[Request], Coroutine[Any, Any, "HTTPResponse | None"]]


def early_stream_errors(handler: Handler,
                        fmt: Callable[[LlamaqError], str] = sse_error) -> Handler:
    """`handler`, its error going out as the stream's error event (`fmt`) where a cold start
    opened the stream before it failed."""
    @functools.wraps(handler)
    async def handled(request: Request) -> HTTPResponse | None:
        try:
            return await handler(request)
        except Exception as exc:
            if not await early_stream_error(request, as_llamaq_error(exc), fmt):
                raise
            return None
    return handled


def ping_interval(request: Request, field: float | None) -> float:
    """Seconds between pings: the request's `sse_ping_interval`, else the server's flag."""
    settings = services(request).settings
    return float(settings.sse_ping_interval if field is None else field)


async def resume_of(request: Request, fleet: Fleet,
                    minted: dict[str, str | int] | None = None) -> Resume:
    """The stream a `Last-Event-ID` header resumes (404 when unknown or expired), or a new
    record holding the ids minted for this response."""
    header = request.headers.get("Last-Event-ID")
    tenant = request.ctx.tenant
    if not header:
        return Resume(StreamRecord(route=request.path, minted=minted or {},
                                   tenant=tenant.name,
                                   conversation=request.headers.get("X-Conversation-Id")))
    event_id = EventId.parse(header)
    record = await StreamRecords(fleet.redis).load(event_id, request.path)
    tenant.check_owner(record.tenant, f"unknown or expired Last-Event-ID {header!r}")
    return Resume(record, event_id.counts)


async def stream_jobs(request: Request, fleet: Fleet, jobs: list[CompletionJob],
                      resume: Resume, fmt: StreamFormat, ping_interval_s: float) -> None:
    await outlive_client(request, _stream_jobs(request, fleet, jobs, resume, fmt,
                                               ping_interval_s))


async def _stream_jobs(request: Request, fleet: Fleet, jobs: list[CompletionJob],
                       resume: Resume, fmt: StreamFormat, ping_interval_s: float) -> None:
    async with _job_events(fleet, jobs, resume) as streams:
        merged = merge_events(streams)
        try:
            response: StreamOut | None = None
            if any(s.hold is not None for s in streams):  # a cold start: open now, comments
                resume.record.job_ids = [s.job_id for s in streams]
                await StreamRecords(fleet.redis).save(resume.record, resume.holder)
                response = await open_stream_once(request)
                try:
                    item = await _next_with_pings(merged, response, COMMENT_EVERY_S,
                                                  lambda: _waiting(streams))
                except LlamaqError as error:  # no worker in time: the stream's error event
                    await response.send(fmt.error(error))
                    await response.eof()
                    return
            else:
                item = await anext(merged)  # errors before any byte: JSON
                resume.record.job_ids = [s.job_id for s in streams]
                await StreamRecords(fleet.redis).save(resume.record, resume.holder)
                response = await open_stream_once(request)
            writer = _Writer(response, resume, len(streams))
            pings = _Pings(response, ping_interval_s)
            try:
                while item is not None:
                    index, event = item
                    if not isinstance(event, StartedEvent):
                        texts = fmt.render(index, event)
                        if inspect.isawaitable(texts):
                            texts = await texts
                        await writer.send(index, texts)
                        pings.sent()
                    item = await anext(merged, None)
                await pings.settle()
                await writer.send(len(streams), [*fmt.end(), *_some(fmt.terminator)])
            except LlamaqError as error:
                await pings.settle()
                await response.send(fmt.error(error))
            except asyncio.CancelledError:
                _hand_off(fleet, resume, streams)
                raise
            finally:
                pings.cancel()
            await response.eof()
        finally:
            await merged.aclose()


@contextlib.asynccontextmanager
async def _job_events(fleet: Fleet, jobs: list[CompletionJob],
                      resume: Resume) -> AsyncIterator[list[JobEvents]]:
    async with contextlib.AsyncExitStack() as stack:
        if resume.have is None:
            streams = [await stack.enter_async_context(fleet.jobs.submit(job)) for job in jobs]
        else:
            streams = [await stack.enter_async_context(
                fleet.jobs.attach(job.model_copy(update={"job_id": job_id})))
                for job, job_id in zip(jobs, resume.record.job_ids, strict=False)]
        yield streams


async def _next_with_pings(merged: AsyncIterator[ChoiceEvent], response: StreamOut,
                           ping_interval_s: float,
                           comment: Callable[[], str] = lambda: PING) -> ChoiceEvent | None:
    """The next event; a ping comment (`comment()`) every `ping_interval_s` while none
    comes."""
    if ping_interval_s <= 0:
        return await anext(merged, None)
    pending = asyncio.ensure_future(anext(merged, None))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=ping_interval_s)
            if done:
                return pending.result()
            await response.send(comment())
    finally:
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending


class _Pings:
    """A ping comment every `interval_s` (<= 0: none) while nothing else went out, from a timer:
    the stream's loop awaits its next event itself, with no task and no timed wait per event
    (issue 44: they were a tenth of the api's CPU per token). A ping whose send fails (the
    client went away) cancels the stream's task, as the failed send of an event would end it."""

    def __init__(self, response: StreamOut, interval_s: float) -> None:
        self._response = response
        self._interval_s = interval_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._last = self._loop.time()
        self._sending: asyncio.Task[None] | None = None
        self._timer = (self._loop.call_at(self._last + interval_s, self._due)
                       if interval_s > 0 else None)

    def sent(self) -> None:
        """Something went out now: the next ping is due `interval_s` from now."""
        self._last = self._loop.time()

    def _due(self) -> None:
        now = self._loop.time()
        due = self._last + self._interval_s
        if now >= due - PING_EARLY_S and (self._sending is None or self._sending.done()):
            self._sending = asyncio.ensure_future(self._ping())
            self._last, due = now, now + self._interval_s
        self._timer = self._loop.call_at(max(due, now + PING_EARLY_S), self._due)

    async def _ping(self) -> None:
        try:
            await self._response.send(PING)
        except Exception:
            if self._task is not None:
                self._task.cancel()

    async def settle(self) -> None:
        """No more pings; one going out ends before the stream's last bytes."""
        self.cancel(ping_too=False)
        if self._sending is not None:
            with contextlib.suppress(Exception):
                await self._sending

    def cancel(self, ping_too: bool = True) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ping_too and self._sending is not None:
            self._sending.cancel()


def _waiting(streams: list[JobEvents]) -> str:
    """A held stream's comment: waiting for a worker while a job is held, else a ping."""
    return COLD_COMMENT if any(s.hold is not None for s in streams) else PING


def _hand_off(fleet: Fleet, resume: Resume, streams: list[JobEvents]) -> None:
    """The client went away: its jobs run on for a while, for a resume."""
    open_jobs = [s.job_id for s in streams if not s.finished]
    for stream in streams:
        stream.handed_off = True
    if open_jobs:
        fleet.jobs.cancel_later(resume.record.record_id, resume.holder, open_jobs)


def _some(text: str) -> list[str]:
    return [text] if text else []


class _Writer:
    """Sends SSE events with their ids, leaving out those the resuming client has."""

    def __init__(self, response: StreamOut, resume: Resume, n_jobs: int) -> None:
        self._response = response
        self._record_id = resume.record.record_id
        self._sent = [0] * (n_jobs + 1)
        self._have = resume.have or [0] * (n_jobs + 1)

    async def send(self, index: int, texts: Iterable[str]) -> None:
        out = []
        for text in texts:
            self._sent[index] += 1
            if self._sent[index] <= self._have[index]:
                continue
            out.append(f"id: {event_id_text(self._record_id, self._sent)}\n{text}")
        if out:
            await self._response.send("".join(out))
