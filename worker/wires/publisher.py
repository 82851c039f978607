"""Job events from the engine thread to Redis: one pipeline (one round trip) per batch of steps.

Each event goes to the job's event log (a Redis stream kept for a bounded time, capped in events
and bytes: worker/wires/event_log_budget.py) and is
announced on the job's pub/sub channel: inline when small, as a pointer to the log when big.
Events Redis refuses are retried in order; past PUBLISH_GRACE_S their jobs are ended (cancelled
in the engine) and each gets an error event as soon as Redis takes writes again, so that no
client waits for events that were never sent. The pipeline also carries, after the events, the
job state a re-run reads and the release of the leases of the jobs that ended (no round trip of
their own).

Owns: the order and delivery of a worker's job events (log + pub/sub), the retry of refused
writes and the end of jobs whose events could not be written. Does not own: what the events say
(the engine and the job functions make them), the api's reading of them (scheduler/hub.py,
scheduler/streams.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from arq.utils import timestamp_ms
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from scheduler.contract import keys
from scheduler.contract.errors import Preempted, Unavailable
from scheduler.contract.results import (
    ErrorEvent,
    Event,
    EventEnvelope,
    FinalEvent,
    TokenEvent,
)
from scheduler.leases import Leases
from worker.engine.loop import JobEvent
from worker.wires.coalesce import can_wait, coalesce
from worker.wires.event_log_budget import EventLogBudget
from worker.wires.fenced_write import FencedJob, add_fenced
from worker.wires.result_offload import ResultOffload

log = logging.getLogger(__name__)

INLINE = b"E"
"""Pub/sub payload tag: the envelope JSON follows."""
POINTER = b"R"
"""Pub/sub payload tag: the decimal seq of an event to read from the job's event log."""
ENDS = ("final", "stored_final", "error")
"""Event kinds that end a job (the results first)."""
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0
TTL_REFRESH_S = keys.EVENT_LOG_TTL_S / 10
"""How often a running job's log and state have their expiry set again (issue 44: an EXPIRE
of each with every event was two of a token's ~6 Redis commands): with its first write, its
last (so each expires its full TTL after the job's last event), and at least this often
between (a log never has less than 90 % of its TTL left while its job runs)."""


def announcement(envelope_json: bytes, seq: int) -> bytes:
    """What pub/sub carries for one event: small ones inline, big ones as a pointer."""
    if len(envelope_json) <= keys.EVENT_INLINE_MAX_BYTES:
        return INLINE + envelope_json
    return POINTER + str(seq).encode()


def add_event(pipe: Pipeline, envelope: EventEnvelope, data: bytes | None = None,
              keep_from: int | None = None, ttl: bool = True) -> None:
    """Log the event in the job's stream (entry id 0-<seq+1>), then announce it. `keep_from`:
    the log loses its events before that seq (worker/wires/event_log_budget.py); else it is
    cut to about EVENT_LOG_MAXLEN. `ttl`: set the log's expiry (see TTL_REFRESH_S)."""
    data = envelope.model_dump_json().encode() if data is None else data
    log_key = keys.job_event_log(envelope.job_id)
    if keep_from is None:
        pipe.xadd(log_key, {"e": data}, id=f"0-{envelope.seq + 1}",
                  maxlen=keys.EVENT_LOG_MAXLEN, approximate=True)
    else:
        pipe.xadd(log_key, {"e": data}, id=f"0-{envelope.seq + 1}",
                  minid=f"0-{keep_from + 1}", approximate=False)
    if ttl:
        pipe.expire(log_key, keys.EVENT_LOG_TTL_S)
    pipe.publish(keys.job_events(envelope.job_id), announcement(data, envelope.seq))


class EventPublisher:
    """Numbers each job's events and publishes them in order; resolves a job's future when its
    final or error event has gone out (or when the job was given up for lack of Redis)."""

    def __init__(self, redis: Redis,
                 before_results: Callable[[Pipeline], None] = lambda _: None,
                 on_lost: Callable[[str], None] = lambda _: None,
                 leases: Leases | None = None,
                 offload: ResultOffload | None = None) -> None:
        """`before_results` adds commands to the pipeline of a batch that starts or ends jobs,
        ahead of the events (so what it writes is there when the client gets its result, and
        an api that sees a job start reads its slot taken).
        `on_lost(job_id)` ends a job whose events could not be sent (cancels it).
        `leases`: the worker's; a job's lease is let go with its final or error event.
        `offload`: big final results go to the object store (worker/wires/result_offload.py)."""
        self._redis = redis
        self._before_results = before_results
        self._on_lost = on_lost
        self._leases = leases
        self._offload = offload
        self._budget = EventLogBudget()
        """What each job's log keeps (its bytes and events capped)."""
        self._loop = asyncio.get_running_loop()
        self._pending: asyncio.Queue[list[JobEvent]] = asyncio.Queue()
        self._next_seq: dict[str, int] = {}
        self._done: dict[str, asyncio.Future[None]] = {}
        self._dropped: set[str] = set()
        """Jobs this worker sends nothing more for (see abandon)."""
        self._lost: set[str] = set()
        """Jobs given up for lack of Redis: their further events are dropped."""
        self._owed: list[EventEnvelope] = []
        """Error events of given-up jobs, sent as soon as Redis takes writes again."""
        self._shown: dict[str, int] = {}
        """Events with output (not "started") sent per running job."""
        self.interval_s = 0.0
        """--stream-interval: the least time between two flushes of later tokens, whose
        events of one job merge meanwhile (worker/wires/coalesce.py); 0: every event as it
        comes."""
        self._last_flush = 0.0
        self._first_token: dict[str, Callable[[int], None]] = {}
        """Called (with the time, ms) once the job's next token event is on Redis."""
        self._ttls_at: dict[str, float] = {}
        """When each running job's log and state last had their expiry set (TTL_REFRESH_S)."""
        self._reply_to: dict[str, str] = {}
        """The channel of the api pod that waits for each job (FencedJob.reply_to)."""
        self._output_told: dict[str, bool] = {}
        """Whether the job's state says it sent output (worker/wires/fenced_write.py
        FencedJob.state: the state is written with a flush only now and then)."""

    def from_thread(self, events: list[JobEvent]) -> None:
        """The engine's sink: called from the engine thread."""
        self._loop.call_soon_threadsafe(self._pending.put_nowait, events)

    def publish(self, events: list[JobEvent]) -> None:
        self._pending.put_nowait(events)

    def expect(self, job_id: str, log_max_bytes: int = 0,
               reply_to: str = "") -> asyncio.Future[None]:
        """The job's end, awaited; `log_max_bytes`: what its event log keeps (its share of its
        request's budget; 0: keys.EVENT_LOG_MAX_BYTES); `reply_to`: the channel of the api pod
        that waits for it ("": its own channel only)."""
        self._budget.limit(job_id, log_max_bytes)
        if reply_to:
            self._reply_to[job_id] = reply_to
        self._dropped.discard(job_id)  # a run after a hand back (a preemption) of this worker
        future = self._loop.create_future()
        self._done[job_id] = future
        return future

    def on_first_token(self, job_id: str, callback: Callable[[int], None]) -> None:
        """Call `callback(now_ms)` once the job's next token event went out (a migrated job's
        first continued token)."""
        self._first_token[job_id] = callback

    def resume(self, job_id: str, seq: int, shown: int = 0) -> None:
        """The job's next event is number `seq` (a run on another worker sent the others, of
        which `shown` had output: a continuation's, so that its state never says it sent
        nothing, which would let a later death run it again from the start)."""
        self._next_seq[job_id] = seq
        if shown:
            self._shown[job_id] = shown

    def abandon(self, job_id: str, reason: BaseException) -> None:
        """This worker sends nothing more for the job (its lease went to another worker, or it
        goes back to the queue); whoever awaits the job gets `reason`."""
        self._dropped.add(job_id)
        self._next_seq.pop(job_id, None)
        self._ttls_at.pop(job_id, None)
        self._output_told.pop(job_id, None)
        self._reply_to.pop(job_id, None)
        self._budget.forget(job_id)
        future = self._done.pop(job_id, None)
        if future is not None and not future.done():
            future.set_exception(reason)

    async def run(self) -> None:
        while True:
            events = await self._pending.get()
            if self.interval_s > 0:  # --stream-interval (worker/wires/coalesce.py)
                wait = self._last_flush + self.interval_s - time.monotonic()
                if wait > 0 and can_wait(events):
                    await asyncio.sleep(wait)
            while not self._pending.empty():
                events.extend(self._pending.get_nowait())
            handed = [j for j, e in events if isinstance(e, ErrorEvent)
                      and e.error.type == Preempted.error_type]
            if handed:  # its events so far go out first, then its run ends without one
                events = [(j, e) for j, e in events if j not in handed]
            if self.interval_s > 0:
                events = coalesce(events)
                self._last_flush = time.monotonic()
            await self._send(events)
            for job_id in handed:
                self.abandon(job_id, Preempted("preempted by a more urgent job"))

    async def _send(self, events: list[JobEvent]) -> None:
        sent: list[tuple[str, Event]] = list(events)
        if self._offload is not None:
            sent = [(j, await self._offload.event(j, e) if isinstance(e, FinalEvent) else e)
                    for j, e in events]
        envelopes = self._number([(j, e) for j, e in sent
                                  if j not in self._lost and j not in self._dropped])
        ends = any(e.event.kind == "started" or e.event.kind in ENDS for e in envelopes)
        released = [] if self._leases is None else self._leases.let_go(
            e.job_id for e in envelopes if e.event.kind in ENDS)
        refused = await self._write(self._owed + envelopes, ends, released)
        if refused is not None:
            self._owed.clear()
            self._fenced_off(refused)
            if self._first_token:
                self._tell_first_tokens(envelopes)
        else:
            refused = set()
            self._give_up(envelopes)
        if self._leases is not None:
            self._leases.released(released)
        for job_id, event in events:
            if event.kind in ENDS and job_id not in refused:
                self._lost.discard(job_id)
                self._finish(job_id, event.kind != "error")

    def _tell_first_tokens(self, envelopes: list[EventEnvelope]) -> None:
        now_ms = timestamp_ms()
        for envelope in envelopes:
            event = envelope.event
            if envelope.job_id in self._first_token and (event.kind in ENDS[:2] or (
                    isinstance(event, TokenEvent) and event.tokens)):
                self._first_token.pop(envelope.job_id)(now_ms)

    def _number(self, events: list[tuple[str, Event]]) -> list[EventEnvelope]:
        envelopes = []
        for job_id, event in events:
            seq = self._next_seq.get(job_id, 0)
            self._next_seq[job_id] = seq + 1
            if event.kind != "started":  # "started" shows nothing: a re-run is still clean
                self._shown[job_id] = self._shown.get(job_id, 0) + 1
            envelopes.append(EventEnvelope(job_id=job_id, seq=seq, event=event))
        return envelopes

    async def _write(self, envelopes: list[EventEnvelope], ends: bool,
                     released: list[str]) -> set[str] | None:
        """Send the events, retrying while Redis refuses them (up to PUBLISH_GRACE_S); the
        leases of `released` go after them. The events of a job whose lease this worker holds
        are written only while Redis says it holds it (worker/wires/fenced_write.py). Returns
        the jobs whose events were refused for a lease gone, or None when Redis would not take
        the events."""
        if not envelopes:
            return set()
        encoded = [envelope.model_dump_json().encode() for envelope in envelopes]
        keep_from = {(e.job_id, e.seq): self._budget.add(e.job_id, e.seq, len(data))
                     for e, data in zip(envelopes, encoded, strict=True)}
        last = {e.job_id: e.seq for e in envelopes}  # a job's last event here cuts its log
        fenced: dict[str, list[tuple[EventEnvelope, bytes, bytes]]] = {}
        for envelope, data in zip(envelopes, encoded, strict=True):
            if self._leases is not None and self._leases.holds(envelope.job_id):
                fenced.setdefault(envelope.job_id, []).append(
                    (envelope, data, announcement(data, envelope.seq)))
        now = time.monotonic()
        ttls = {job_id for job_id in last if self._ttls_due(job_id, now)
                or self._ends(envelopes, job_id)}
        states = ttls | {job_id for job_id in last  # whether it sent output: as it turns true
                         if self._shown.get(job_id, 0) > 0 and not self._output_told.get(job_id)}
        deadline = now + keys.PUBLISH_GRACE_S
        delay = RETRY_FIRST_S
        while True:
            try:
                at_ms = timestamp_ms()
                async with self._redis.pipeline(transaction=False) as pipe:
                    if ends:
                        self._before_results(pipe)
                    next_seq: dict[str, int] = {}
                    for envelope, data in zip(envelopes, encoded, strict=True):
                        if envelope.job_id in fenced:
                            continue
                        cut = (keep_from[envelope.job_id, envelope.seq]
                               if last[envelope.job_id] == envelope.seq else None)
                        add_event(pipe, envelope, data, cut,  # once a job a flush
                                  envelope.job_id in ttls
                                  and last[envelope.job_id] == envelope.seq)
                        next_seq[envelope.job_id] = envelope.seq + 1
                    for job_id, seq in next_seq.items():  # a re-run must know what went out
                        pipe.hset(keys.job_state(job_id), mapping={
                            "sent": str(self._shown.get(job_id, 0)), "seq": str(seq),
                            "at": str(at_ms)})
                        if job_id in ttls:
                            pipe.expire(keys.job_state(job_id), keys.JOB_STATE_TTL_S)
                    answer = len(pipe)
                    if fenced:
                        add_fenced(pipe, self._worker_id(), [
                            FencedJob(job_id, written, self._shown.get(job_id, 0),
                                      keep_from[job_id, last[job_id]], job_id in ttls,
                                      job_id in states, self._reply_to.get(job_id, ""),
                                      release=job_id in released,
                                      state_ttl=job_id in self._ttls_at
                                      or self._ends(envelopes, job_id))
                            for job_id, written in fenced.items()], at_ms)
                    if self._leases is not None:  # those of fenced jobs went with their events
                        self._leases.release_on(pipe, [j for j in released if j not in fenced])
                    results = await pipe.execute(raise_on_error=False)
                _check(results)
                self._ttls_at.update(dict.fromkeys(ttls, now))
                self._output_told.update({j: self._shown.get(j, 0) > 0 for j in states})
                if not fenced:
                    return set()
                return {job_id for job_id, ok in zip(fenced, results[answer], strict=True)
                        if not ok}
            except RedisError as error:
                if time.monotonic() >= deadline:
                    log.error("could not send %d events for %gs (%s); ending their jobs",
                              len(envelopes), keys.PUBLISH_GRACE_S, error)
                    return None
                log.warning("could not send %d events (%s); retrying", len(envelopes), error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _ttls_due(self, job_id: str, now: float) -> bool:
        return now - self._ttls_at.get(job_id, -TTL_REFRESH_S) >= TTL_REFRESH_S

    @staticmethod
    def _ends(envelopes: list[EventEnvelope], job_id: str) -> bool:
        return any(e.job_id == job_id and e.event.kind in ENDS for e in envelopes)

    def _worker_id(self) -> str:
        return "" if self._leases is None else self._leases.worker_id

    def _fenced_off(self, job_ids: set[str]) -> None:
        """Jobs whose lease went to another worker (this one was too slow to renew it): it
        continues there from the event log; this worker stops them and sends nothing more."""
        for job_id in job_ids:
            log.error("job %s: lease lost (this worker was too slow to renew it); its events "
                      "were not written, and it stops here", job_id)
            if self._leases is not None:
                self._leases.lost(job_id)
            self.abandon(job_id, Unavailable("lease lost"))
            self._first_token.pop(job_id, None)
            self._shown.pop(job_id, None)
            self._on_lost(job_id)

    def _give_up(self, envelopes: list[EventEnvelope]) -> None:
        """End the jobs whose events are lost; their clients get an error event later."""
        for job_id in dict.fromkeys(e.job_id for e in envelopes):
            if any(e.job_id == job_id and e.event.kind in ENDS for e in envelopes):
                ended = True
            else:
                ended = False
                self._lost.add(job_id)
                self._on_lost(job_id)
            error = Unavailable("the worker could not send this request's events: Redis "
                                "is unreachable")
            seq = self._next_seq.get(job_id, 0)
            self._next_seq[job_id] = seq + 1
            self._owed.append(EventEnvelope(job_id=job_id, seq=seq,
                                            event=ErrorEvent(error=error.to_info())))
            if ended:
                self._next_seq.pop(job_id, None)

    def _finish(self, job_id: str, ok: bool) -> None:
        self._next_seq.pop(job_id, None)
        self._ttls_at.pop(job_id, None)
        self._output_told.pop(job_id, None)
        self._reply_to.pop(job_id, None)
        self._budget.forget(job_id)
        self._first_token.pop(job_id, None)
        self._shown.pop(job_id, None)
        self._dropped.discard(job_id)
        future = self._done.pop(job_id, None)
        if future is not None and not future.done():
            future.set_result(None)
        log.debug("job %s: ended (%s)", job_id, "final" if ok else "error")


def _check(results: list[object]) -> None:
    """Raise the first error of a pipeline, except an XADD refused as a duplicate (the entry
    went in on an attempt whose answer was lost)."""
    for result in results:
        if isinstance(result, ResponseError) and "equal or smaller" not in str(result):
            raise result
        if isinstance(result, RedisError) and not isinstance(result, ResponseError):
            raise result
