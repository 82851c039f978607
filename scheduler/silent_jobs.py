"""The api pod's looks at its silent jobs, all of them in one round trip (issue 44).

A job whose stream is silent for keys.OWNER_CHECK_EVERY_S is looked at: is its run still held
(its lease), did its worker die (scheduler/leases.py), is the one worker it is pinned to gone,
and does its log hold events pub/sub did not bring? Each job asked on its own cost five
commands in three round trips twice a second: one api core held ~870 slow streams (1 token a
second). Here the looks of all of a pod's silent jobs go to Redis together: one script (one
EVALSHA) at most every LOOK_EVERY_S, whose answer each waiting job reads; a job whose next
event comes first leaves without waiting for it. The log is read only where no run holds the
job (it ended, died, or waits to run): a worker writes a job's events before it lets the
lease go, and while it holds the lease a lost event is followed by another (a gap, read back
then) or by the lease's end. A dead worker process is seen by its connections
(scheduler/worker_presence.py), once for all of its jobs: gone at two looks keys.GONE_FOR_S
apart, its silent jobs' leases are taken at once.

Owns: SilentJobs (one a pod; it holds the pod's scheduler/wake.py Rewakes), Look (what one
look found)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.errors import LlamaqError
from scheduler.hub import HubItem
from scheduler.leases import Lapse
from scheduler.wake import Rewakes
from scheduler.worker_presence import WorkerPresence, client_name

log = logging.getLogger(__name__)

LOOK_EVERY_S = 0.1
"""A pod's looks go to Redis at most this often (a silent job waits this long at most for
its look, on top of keys.OWNER_CHECK_EVERY_S of silence)."""

ERROR_WAIT_S = 1.0
"""How long an error from the hub waits for a look already asked for."""

LOOK = """
-- KEYS, 4 a job: its owner key, its state, its event log, the info key of the worker it is
-- pinned to (read only when pinned). ARGV, 2 a job: the seq of the next event the pod
-- awaits, '1' when pinned. Per job: owner, tries, sent, handed, conn, the pinned worker
-- alive (1/0), its log holds the awaited event (1/0; looked at only when no run holds it).
local out = {}
for j = 0, #ARGV / 2 - 1 do
  local k = 4 * j
  local owner = redis.call('GET', KEYS[k + 1])
  local state = redis.call('HMGET', KEYS[k + 2], 'tries', 'sent', 'handed', 'conn')
  local alive = 1
  if ARGV[2 * j + 2] == '1' then alive = redis.call('EXISTS', KEYS[k + 4]) end
  local logged = 0
  if not owner then
    local first = '0-' .. (tonumber(ARGV[2 * j + 1]) + 1)
    if #redis.call('XRANGE', KEYS[k + 3], first, '+', 'COUNT', 1) > 0 then logged = 1 end
  end
  out[#out + 1] = owner
  out[#out + 1] = state[1]
  out[#out + 1] = state[2]
  out[#out + 1] = state[3]
  out[#out + 1] = state[4]
  out[#out + 1] = alive
  out[#out + 1] = logged
end
return out
"""


@dataclass(frozen=True)
class Look:
    """What Redis held of one silent job at one look."""

    held: bool
    """A run holds its lease."""
    tries: int
    sent: int
    handed: bool
    """Preempted: it waits in its queue again."""
    pinned_alive: bool
    """The worker it is pinned to is registered (True when it is pinned to none)."""
    logged: bool
    """Its log holds the event the pod awaits (or its lease was just taken: read it)."""

    def lapse(self) -> Lapse | None:
        """Its worker died (the lease of a started run lapsed), or the one worker it is
        pinned to is gone. None while it runs or waits in a queue."""
        if self.handed:
            return None
        if not self.pinned_alive:
            return Lapse(tries=max(self.tries, 1), sent=self.sent)
        if self.held or self.tries == 0:
            return None
        return Lapse(tries=self.tries, sent=self.sent)


@dataclass(eq=False)
class _Ticket:
    job_id: str
    next_seq: int
    pinned_worker: str | None
    timeout: asyncio.Timeout | None = None
    """The waiting job's; set to expire when its look came."""
    look: Look | None = None
    error: BaseException | None = None


class SilentJobs:
    """One pod's looks at its silent jobs: `look` waits for the next batch's answer about
    one job (or for the job's next event, whichever comes first)."""

    def __init__(self, redis: Redis, presence: WorkerPresence | None = None) -> None:
        self._redis = redis
        self._presence = presence
        self.rewakes = Rewakes(redis)
        """The pod's rewakes of its jobs that wait unclaimed (one round trip a tick too)."""
        self._script = redis.register_script(LOOK)
        self._waiting: dict[_Ticket, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0
        self._gone: dict[str, tuple[float, float]] = {}
        """Workers seen without a connection: first and last such look."""

    async def look(self, job_id: str, next_seq: int, pinned_worker: str | None,
                   queue: asyncio.Queue[HubItem]) -> Look | HubItem:
        """The job's look, or the event its queue got first. An error the queue got (the
        hub gave up on Redis: a pod frozen past its grace, say) waits up to ERROR_WAIT_S for
        the look and goes back in the queue behind it; the look then says to read the log,
        which may hold the job's end (as the job's own read of its log found it before the
        looks were batched)."""
        ticket = _Ticket(job_id, next_seq, pinned_worker)
        self._waiting[ticket] = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._looks())
        item: HubItem | None = None
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None) as timeout:
                    ticket.timeout = timeout
                    item = await queue.get()
                    if not isinstance(item, LlamaqError):
                        return item
                    if ticket.look is None and ticket.error is None:
                        loop = asyncio.get_running_loop()
                        timeout.reschedule(loop.time() + ERROR_WAIT_S)
                        await loop.create_future()  # until the look comes
        finally:
            ticket.timeout = None
            self._waiting.pop(ticket, None)
        if ticket.look is None:
            if item is not None:
                return item
            assert ticket.error is not None
            raise ticket.error
        if item is not None:  # its log is read first even while a run holds it: the run
            queue.put_nowait(item)  # may have logged its end and not yet let the lease go
            return dataclasses.replace(ticket.look, logged=True)
        return ticket.look

    async def _looks(self) -> None:
        """Batches, while jobs wait for their looks."""
        try:
            while self._waiting:
                await asyncio.sleep(max(0.0, self._last + LOOK_EVERY_S - time.monotonic()))
                tickets = [t for t in self._waiting if t.look is None and t.error is None]
                self._last = time.monotonic()
                if not tickets:
                    continue
                try:
                    looks = await self._look_at(tickets)
                except Exception as error:  # e.g. Redis away: each job decides what it means
                    for ticket in tickets:
                        ticket.error = error
                else:
                    for ticket, found in zip(tickets, looks, strict=True):
                        ticket.look = found
                now = asyncio.get_running_loop().time()
                for ticket in tickets:
                    if ticket.timeout is not None:  # still waiting: its look is here
                        ticket.timeout.reschedule(now)
                    self._waiting.pop(ticket, None)
        finally:
            self._task = None

    async def _look_at(self, tickets: list[_Ticket]) -> list[Look]:
        names: list[str] = []
        args: list[str] = []
        for t in tickets:
            names += [keys.job_owner(t.job_id), keys.job_state(t.job_id),
                      keys.job_event_log(t.job_id),
                      keys.worker_info(t.pinned_worker or "-")]
            args += [str(t.next_seq), "1" if t.pinned_worker else ""]
        flat = await self._script(keys=names, args=args)
        looks: list[Look] = []
        owners: dict[int, str] = {}
        for i in range(len(tickets)):
            owner, tries, sent, handed, conn, alive, logged = flat[7 * i: 7 * i + 7]
            looks.append(Look(held=bool(owner), tries=int(tries or 0), sent=int(sent or 0),
                              handed=bool(handed), pinned_alive=bool(alive),
                              logged=bool(logged)))
            if owner and conn:
                worker_id = _text(owner)
                if _text(conn) == client_name(worker_id):  # else an older build: leases only
                    owners[i] = worker_id
        for i in await self._dead(owners, tickets):
            looks[i] = dataclasses.replace(looks[i], held=False, logged=True)
        return looks

    async def _dead(self, owners: dict[int, str], tickets: list[_Ticket]) -> list[int]:
        """The tickets whose owner had no Redis connection at two looks keys.GONE_FOR_S
        apart, their leases taken now."""
        if self._presence is None or not owners:
            return []
        now = time.monotonic()
        stale = 2 * keys.GONE_FOR_S + LOOK_EVERY_S
        self._gone = {w: seen for w, seen in self._gone.items() if now - seen[1] <= stale}
        dead: set[str] = set()
        for worker_id in set(owners.values()):
            connected = await self._presence.connected(worker_id)
            if connected is not False:
                self._gone.pop(worker_id, None)
                continue
            first = self._gone.get(worker_id, (now, now))[0]  # older sightings were dropped
            self._gone[worker_id] = (first, now)
            if now - first >= keys.GONE_FOR_S:
                dead.add(worker_id)
        taken: list[int] = []
        for i, worker_id in owners.items():
            if worker_id not in dead:
                continue
            job_id = tickets[i].job_id
            if await self._presence.take_lease(job_id, worker_id):
                log.warning("job %s: worker %s has no Redis connection (its process "
                            "ended); its lease is taken now", job_id, worker_id)
                taken.append(i)
        for worker_id in dead:
            self._gone.pop(worker_id, None)
        return taken


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
