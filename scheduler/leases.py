"""Job leases on top of arq: who runs a job, whether its worker is alive, and the one rule for
re-runs.

arq keeps a taken job in its queue's sorted set under an "in-progress" key that lives as long as
`job_timeout`: a worker killed with SIGKILL leaves its jobs locked for that long. llamaq instead
gives every taken job a short lease (arq's in-progress key and our owner key, JOB_LEASE_S) that the
live worker renews every LEASE_RENEW_EVERY_S. When the worker dies the lease lapses within
seconds; arq then hands the job to the next worker that polls (a re-run of the same job id), and
the api that waits for the job sees the lapse too.

The rule (decided here, applied by the worker that starts a job and by the api that waits):
- a job whose worker died before it sent anything runs once more, on another worker;
- a job that sent something when its worker died ends with 503 (its client already has part
  of the answer), unless it is a completion with a migration limit (--migration-limit): then
  it continues on another worker from its event log (scheduler/migration.py);
- a job that was running at one worker death more than it may survive (a second, or the
  migration limit + 1st) ends with 500 `server_error` and is never run again (a poison job:
  it may be what kills workers);
- pinned and utility jobs (`worker_id`, slot actions, tokenize) never move: 503.

Relies on arq 0.28's in-progress key name (`arq.constants.in_progress_key_prefix`) and on its
Worker attributes `in_progress_timeout_s`, `tasks` and `start_jobs`' bookkeeping (pinned in
pyproject; the seam is tested in tests/fleet/queue/test_arq_seam.py and test_faults_jobs.py).
A poll claims jobs (sets their in-progress keys) in the script that finds them (CLAIM_JOBS), and
a job's owner key goes in the pipeline of its last event (`let_go`, `release_on`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from scheduler.contract import keys
from scheduler.fair_share import FAIR_ADVANCE
from scheduler.lua_leases import LEASES_OF, RELEASE, renew_script
from scheduler.queue_order import ORDER_CLAIM
from scheduler.redis_clock import LUA_NOW_MS
from scheduler.wake import WAIT_FOR_JOBS
from scheduler.worker_presence import client_name

log = logging.getLogger(__name__)

CLAIM_JOBS = LUA_NOW_MS + LEASES_OF + ORDER_CLAIM + FAIR_ADVANCE + WAIT_FOR_JOBS + """
-- KEYS: an arq queue, its order, its model's fair state (scheduler/queue_order.py claim_keys;
-- absent: none, as a queue with no tenants' jobs); ARGV: (unused: due is by Redis's TIME, as
-- the queue's scores), how many jobs, arq's in-progress prefix, lease (ms),
-- then (optional) the queue's waiters, the worker's wake channel and the waiters' TTL (ms):
-- a claim that takes fewer jobs than asked (the queue held no more) makes the worker wait for
-- the next job queued there, one that takes as many stops its waiting (scheduler/wake.py).
-- Claims the first waiting jobs that no live worker holds in the queue's order (priority,
-- then order score), however many running jobs come first (arq itself reads a window of ~100
-- ids and skips the held ones: a cap on the fleet): sets each one's in-progress key for the
-- lease as arq's start_jobs does, in the same step, so two workers never take one job. Jobs
-- in no order set come after, the oldest due first. The model's virtual time moves up to the
-- largest start tag taken (scheduler/fair_share.py). Returns id, score, id, score, ...
local wanted = tonumber(ARGV[2])
local claimed = {}
local function take(id, score)
  redis.call('PSETEX', ARGV[3] .. id, ARGV[4], '1')
  claimed[#claimed + 1] = id
  claimed[#claimed + 1] = score
end
local n, unordered, top = order_claim(KEYS[1], KEYS[2], wanted, ARGV[3], take)
if top ~= nil and KEYS[3] then fair_advance(KEYS[3], top) end
local offset = 0
while unordered and n < wanted do
  local page = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_score, 'WITHSCORES',
                          'LIMIT', offset, 200)
  if #page == 0 then break end
  local held = leases_of(ARGV[3], page, 2)
  for i = 1, #page, 2 do
    if not held[(i + 1) / 2] then
      take(page[i], page[i + 1])
      n = n + 1
      if n >= wanted then break end
    end
  end
  offset = offset + 200
end
if ARGV[5] then wait_for_jobs(ARGV[5], ARGV[6], wanted - n, ARGV[7]) end
return claimed
"""

WAITING_JOBS = LUA_NOW_MS + LEASES_OF + """
-- KEYS[1]: an arq queue; ARGV: (unused), arq's in-progress prefix.
-- How many due jobs no worker holds, the enqueue score (ms) of the oldest of them, and
-- Redis's now (ms) to measure its wait against.
local count, oldest, offset = 0, -1, 0
while true do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_score, 'WITHSCORES',
                         'LIMIT', offset, 500)
  if #ids == 0 then break end
  local held = leases_of(ARGV[2], ids, 2)
  for i = 1, #ids, 2 do
    if not held[(i + 1) / 2] then
      count = count + 1
      if oldest < 0 then oldest = tonumber(ids[i + 1]) end
    end
  end
  offset = offset + 500
end
return {count, tostring(oldest), tostring(now_ms)}
"""

def lease_ms() -> int:
    return int(keys.JOB_LEASE_S * 1000)


class Decision(enum.Enum):
    RUN = "run"
    MIGRATE = "migrate"
    """The job sent output, and it continues on another worker from its event log (a
    completion with migrations left; scheduler/migration.py)."""
    WORKER_DIED = "worker_died"
    """503: the job cannot run again (it sent something, or it is pinned)."""
    POISON = "poison"
    """500: the job was running at one worker death more than it may survive."""


def decide(tries: int, sent: int, movable: bool, migration_limit: int = 0) -> Decision:
    """What to do with a job at its `tries`-th start (1 = first), or, on the api's side,
    after its `tries`-th run died. A job survives max(1, migration_limit) worker deaths (one
    re-run of a job that sent nothing, as without migration); past that it is a poison job.
    One that sent something continues (MIGRATE) only with a migration limit."""
    if tries <= 1:
        return Decision.RUN
    if tries - 1 > max(1, migration_limit):
        return Decision.POISON
    if not movable:
        return Decision.WORKER_DIED
    if sent > 0:
        return Decision.MIGRATE if migration_limit > 0 else Decision.WORKER_DIED
    return Decision.RUN


def died_after(tries: int, sent: int, movable: bool, migration_limit: int = 0) -> Decision:
    """The api's view when the lease of run number `tries` lapsed: RUN or MIGRATE means the
    job goes on elsewhere."""
    return decide(tries + 1, sent, movable, migration_limit)


@dataclass(frozen=True)
class Start:
    tries: int
    sent: int
    """Events with output the job's earlier runs sent (a "started" event is none)."""
    cancelled: bool
    next_seq: int = 0
    """The seq of the job's next event (earlier runs numbered theirs from 0)."""
    previous_worker: str = ""
    """The worker of the job's last run ("" on its first)."""
    last_event_ms: int = 0
    """When its earlier runs last wrote events (ms; 0: none)."""
    handed: bool = False
    """Its last run was preempted (`hand_back(preempted=True)`): it continues from its event
    log, whatever the migration limit."""
    preempted: int = 0
    """How many times it was preempted (the aging rule: worker/process/preempt.py)."""


class Leases:
    """The worker's side: start a job under a lease, renew the leases, let them go."""

    def __init__(self, redis: Redis, worker_id: str) -> None:
        self._redis = redis
        self._worker_id = worker_id
        self._renew = redis.register_script(renew_script())
        self.held: set[str] = set()
        """Jobs whose lease this worker took and has not let go."""
        self.releasing: set[str] = set()
        """Jobs let go whose last event (with their release) is on its way: still renewed,
        never reported lost."""
        self.gone: set[str] = set()
        """Jobs whose lease this worker lost while running them (see `forget_gone`)."""
        self.claimed: set[str] = set()
        """Jobs a poll of this worker claimed (set their in-progress keys) whose runs have
        not ended: until `start` takes the lease, only the in-progress key is renewed."""

    @property
    def worker_id(self) -> str:
        return self._worker_id

    def holds(self, job_id: str) -> bool:
        """This worker took the job's lease and its last event has not gone out: its events
        are written only while Redis says so too (worker/wires/fenced_write.py)."""
        return job_id in self.held or job_id in self.releasing

    def lost(self, job_id: str) -> None:
        """The job's lease turned out to be gone (a write refused): it is not renewed."""
        self.held.discard(job_id)
        self.gone.add(job_id)

    def forget_gone(self, job_id: str) -> bool:
        """Whether this worker lost the job's lease while running it (then the job, in its
        queue, is another run's now: this run's end must not finish it in arq), forgetting
        it."""
        if job_id in self.gone:
            self.gone.discard(job_id)
            return True
        return False

    async def start(self, job_id: str) -> Start:
        """Take the job's lease (its owner key). The job counts as held only once the owner
        key is written: a renewal (worker/process/lease_keeper.py, another thread) that
        took its list before would find no owner and call the job lost."""
        state = keys.job_state(job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.exists(keys.job_cancel(job_id))
            pipe.hincrby(state, "tries", 1)
            pipe.hmget(state, ["sent", "seq", "worker", "at", "handed", "preempted"])
            pipe.xrevrange(keys.job_event_log(job_id), count=1)  # the state's seq may lag
            pipe.hset(state, mapping={"worker": self._worker_id,
                                      "conn": client_name(self._worker_id)})
            pipe.hdel(state, "handed")
            pipe.expire(state, keys.JOB_STATE_TTL_S)
            pipe.set(keys.job_owner(job_id), self._worker_id, px=lease_ms())
            cancelled, tries, (sent, seq, worker, at, handed, preempted), last, *_ = \
                await pipe.execute()
        self.held.add(job_id)
        logged = int(_text(last[0][0]).split("-")[1]) if last else 0  # entry 0-<seq + 1>
        return Start(tries=int(tries), sent=int(sent or 0), cancelled=bool(cancelled),
                     next_seq=max(int(seq or sent or 0), logged),
                     previous_worker=_text(worker) if worker else "",
                     last_event_ms=int(at or 0), handed=bool(handed),
                     preempted=int(preempted or 0))

    async def hand_back(self, job_id: str, preempted: bool = False) -> None:
        """The job goes back to the queue: this run does not count as a try. `preempted`: it
        ran, and its next run continues from its event log (`Start.handed`)."""
        self.held.discard(job_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.job_state(job_id), "tries", -1)
            if preempted:
                pipe.hset(keys.job_state(job_id), "handed", "1")
                pipe.hincrby(keys.job_state(job_id), "preempted", 1)
            pipe.delete(keys.job_owner(job_id))
            await pipe.execute()

    async def release(self, job_id: str) -> None:
        """Let the job's lease go (a no-op when it went already with the job's last event,
        see `let_go`, or was lost)."""
        if job_id not in self.held:
            return
        self.held.discard(job_id)
        await self._redis.delete(keys.job_owner(job_id))

    def let_go(self, job_ids: Iterable[str]) -> list[str]:
        """Of jobs whose last event goes out now, those this worker holds: `release_on` lets
        their leases go in the same pipeline as that event, after it (so the api never sees a
        lease gone before the job's end). Until `released`, they are renewed still (the event
        may take retries) but never reported lost."""
        ids = [job_id for job_id in dict.fromkeys(job_ids) if job_id in self.held]
        self.held.difference_update(ids)
        self.releasing.update(ids)
        return ids

    def released(self, job_ids: list[str]) -> None:
        """The pipeline of `let_go`'s jobs went out (or was given up: their leases lapse)."""
        self.releasing.difference_update(job_ids)

    def release_on(self, pipe: Pipeline, job_ids: list[str]) -> None:
        """Queue on `pipe` the release of the leases `let_go` returned (of those this worker
        still holds: no other worker's lease is touched). EVAL, not EVALSHA: a script in a
        pipeline would cost redis-py a SCRIPT EXISTS round trip per execute."""
        if job_ids:
            pipe.eval(RELEASE, len(job_ids), *(keys.job_owner(j) for j in job_ids),
                      self._worker_id)

    def to_renew(self) -> list[str | int]:
        """A renewal's arguments (scheduler/lua_leases.py RENEW): the claimed jobs not started,
        then those started. Safe from another thread (the lease keeper's): set operations,
        which the GIL does not split; [] when there is nothing to renew."""
        started = self.held | self.releasing
        claimed = list(self.claimed - started)
        if not started and not claimed:
            return []
        return [self._worker_id, lease_ms(), len(claimed), *claimed, *started]

    def renewed(self, lost: Iterable[bytes | str]) -> list[str]:
        """A renewal's answer (the ids it found lost), on the event loop: the jobs this
        worker lost (not those let go meanwhile: a job that ended is not lost)."""
        ids = [job_id for job_id in map(_text, lost) if job_id in self.held]
        self.held.difference_update(ids)
        self.gone.update(ids)
        return ids

    async def renew(self) -> list[str]:
        """Renew the leases this worker holds on the event loop (the lease keeper's thread
        does it in a worker); the ids of those it lost."""
        args = self.to_renew()
        return self.renewed(await self._renew(args=args)) if args else []


@dataclass(frozen=True)
class Lapse:
    """A run of a job whose worker stopped renewing its lease."""

    tries: int
    sent: int


async def forget_queued(redis: Redis, queue_name: str, job_id: str) -> None:
    """Take a job out of a queue nobody will poll again (the own queue of a dead worker)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zrem(queue_name, job_id)
        pipe.delete(job_key_prefix + job_id, retry_key_prefix + job_id)
        await pipe.execute()


async def waiting_jobs(redis: Redis, queue_name: str) -> tuple[int, float]:
    """How many jobs of the queue wait for a worker, and how long the oldest has waited (s)."""
    script = redis.register_script(WAITING_JOBS)  # EVALSHA: not the text on every request
    count, oldest, now = await script(keys=[queue_name], args=[0, in_progress_key_prefix])
    oldest_ms, now_ms = float(oldest), float(now)
    return int(count), max(0.0, now_ms - oldest_ms) / 1000 if oldest_ms >= 0 else 0.0


async def count_retry(redis: Redis, model_id: str) -> None:
    await redis.hincrby(keys.model_counters(model_id), "retried", 1)  # type: ignore[misc]


async def count_preemption(redis: Redis, model_id: str) -> None:
    await redis.hincrby(keys.model_counters(model_id), "preempted", 1)  # type: ignore[misc]


async def count_migration(redis: Redis, model_id: str) -> None:
    await redis.hincrby(keys.model_counters(model_id), "migrated", 1)  # type: ignore[misc]


MIGRATION_STALL_BUCKETS_S = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)
"""The buckets (le, seconds) of llamaq:migration_stall_seconds."""


async def observe_migration_stall(redis: Redis, model_id: str, stall_s: float) -> None:
    """One migrated job's stall (its last token before the death to its first continued
    one) into the model's histogram (cumulative buckets, as Prometheus keeps them)."""
    async with redis.pipeline(transaction=False) as pipe:
        for bound in MIGRATION_STALL_BUCKETS_S:
            if stall_s <= bound:
                pipe.hincrby(keys.model_counters(model_id), f"stall_le:{bound:g}", 1)
        pipe.hincrby(keys.model_counters(model_id), "stall_count", 1)
        pipe.hincrby(keys.model_counters(model_id), "stall_sum_ms", round(stall_s * 1000))
        await pipe.execute()


async def count_failure(redis: Redis, model_id: str, cause: str) -> None:
    await redis.hincrby(keys.model_counters(model_id), f"failed:{cause}", 1)  # type: ignore[misc]


async def counters(redis: Redis, model_id: str) -> dict[str, int]:
    raw = await redis.hgetall(keys.model_counters(model_id))  # type: ignore[misc]
    return {_text(k): int(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
