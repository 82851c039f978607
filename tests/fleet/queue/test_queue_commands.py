"""What a job costs Redis in the queue's scripts (issue 44): a worker's claim and the enqueue's
backpressure count read a page of jobs' queue scores and leases in one command each (ZMSCORE,
MGET), not one ZSCORE and one EXISTS a job, running jobs included; and the count stays right
as jobs are handed back, cancelled, or their lease lapses (a dead worker). Real Redis (its own,
so that INFO commandstats counts only this file's commands), the scripts the api and the
workers run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import arq.utils
import pytest
import pytest_asyncio
from arq.connections import ArqRedis, create_pool
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.worker import func
from redis.asyncio import Redis

from scheduler.client import JobClient, QueueRoom
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.errors import Unavailable
from scheduler.contract.jobs import CompletionJob
from scheduler.fair_share import KEY_REFRESH_MS
from scheduler.hub import EventHub
from scheduler.leases import CLAIM_JOBS, Leases, lease_ms, waiting_jobs
from scheduler.queue_index import index_key, move_to_shared
from scheduler.queue_order import claim_keys
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.wake import WAITERS_TTL_MS, Rewakes
from tests.processes import start_redis
from worker.process.arq_worker import WakeableWorker

pytestmark = pytest.mark.process

RUNNING = 450
"""Jobs held ahead of the waiting ones: more than two pages of the order (200 each)."""
PER_CALL_MAX = 40
"""Commands one claim or one enqueue may cost here, however many jobs run (before: ~2 a
running job: 900 and more)."""


@pytest.fixture(scope="module")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_redis(Path(tmp_path_factory.mktemp("redis-commands")))
    yield url
    process.terminate()
    process.wait()


@pytest_asyncio.fixture
async def pod(own_redis_url: str) -> AsyncIterator[tuple[Redis, ArqRedis, JobClient]]:
    redis = Redis.from_url(own_redis_url)
    pool = await create_pool(arq_settings(own_redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    yield redis, pool, JobClient(redis, pool, EventHub(redis), 10)
    await pool.aclose()
    await redis.aclose()


async def claim(redis: Redis, queue: str, wanted: int, lease_ms: int = 60_000) -> list[str]:
    """A worker's poll (worker/process/arq_worker.py's arguments)."""
    claimed = await redis.register_script(CLAIM_JOBS)(
        keys=claim_keys(queue), args=[arq.utils.timestamp_ms(), wanted,
                                      in_progress_key_prefix, lease_ms])
    return [claimed[i].decode() for i in range(0, len(claimed), 2)]


async def calls(redis: Redis) -> int:
    """Commands Redis ran so far, those inside scripts included (INFO itself not)."""
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


async def queued(client: JobClient, model: str, n: int, room: QueueRoom | None = None
                 ) -> list[CompletionJob]:
    jobs = [CompletionJob(model=model, prompt="p", priority=2) for _ in range(n)]
    for job in jobs:
        await client._enqueue(job, keys.slot_queue(model), room)
    return jobs


async def test_a_claim_behind_running_jobs_costs_commands_by_the_page(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"claim-cost-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = await queued(client, model, RUNNING + 1)
    assert len(await claim(redis, queue, RUNNING)) == RUNNING
    await claim(redis, queue, 0)  # the script loaded: EVALSHA from here on
    before = await calls(redis)
    assert await claim(redis, queue, 5) == [jobs[-1].job_id]
    assert await calls(redis) - before <= PER_CALL_MAX


async def test_the_backpressure_count_costs_commands_by_the_page(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"bound-cost-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    room = QueueRoom(10, (queue,))
    await queued(client, model, RUNNING + 5)
    assert len(await claim(redis, queue, RUNNING)) == RUNNING
    before = await calls(redis)
    await queued(client, model, 1, room)  # 5 wait, then 6: the bound is 10
    assert await calls(redis) - before <= PER_CALL_MAX
    await queued(client, model, 4, room)
    with pytest.raises(Unavailable, match=r"\(10 requests wait\)"):
        await queued(client, model, 1, room)


async def test_the_count_follows_hand_backs_cancels_and_lapsed_leases(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """What the bound and the claim count as waiting: a job handed back (its lease deleted)
    waits again at once; a cancelled one (out of its queue) does not; a running job whose
    worker died waits again as soon as its lease lapses, and the next claim takes it."""
    redis, _, client = pod
    model = f"count-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = await queued(client, model, 6)
    held = await claim(redis, queue, 3)
    assert held == [job.job_id for job in jobs[:3]]
    assert (await waiting_jobs(redis, queue))[0] == 3
    await redis.delete(in_progress_key_prefix + held[0])  # handed back
    assert (await waiting_jobs(redis, queue))[0] == 4
    await redis.zrem(queue, jobs[5].job_id)  # cancelled while it waited
    assert (await waiting_jobs(redis, queue))[0] == 3
    await redis.pexpire(in_progress_key_prefix + held[1], 50)  # its worker died
    await asyncio.sleep(0.2)
    assert (await waiting_jobs(redis, queue))[0] == 4
    room = QueueRoom(5, (queue,))
    await client._enqueue(CompletionJob(model=model, prompt="q", priority=2), queue, room)
    with pytest.raises(Unavailable, match=r"\(5 requests wait\)"):
        await client._enqueue(CompletionJob(model=model, prompt="r", priority=2), queue, room)
    taken = await claim(redis, queue, 10)
    assert taken[:4] == [held[0], held[1], jobs[3].job_id, jobs[4].job_id]
    assert len(taken) == 5 and jobs[5].job_id not in taken
    assert (await waiting_jobs(redis, queue))[0] == 0


LIVE_WORKERS = 300
"""Live workers whose own queues the model's bound counts (before: a ZRANGEBYSCORE of each
one's queue per enqueue, 300 commands and more)."""


def bounded_client(redis: Redis, pool: ArqRedis, limit: int, queues: list[str]) -> JobClient:
    """A pod whose bound of the model counts `queues` (api/fleet.py queue_limit's shape)."""

    async def room(_: str) -> QueueRoom:
        return QueueRoom(limit, tuple(queues))

    return JobClient(redis, pool, EventHub(redis), 10, queue_limit=room)


async def test_the_bound_costs_the_same_whatever_the_live_workers(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """The model's bound counts its shared queue and each live worker's own queue; it reads
    the model's index of queued jobs, not each queue (scheduler/queue_index.py)."""
    redis, pool, _ = pod
    model = f"index-cost-{time.monotonic_ns()}"
    shared = keys.slot_queue(model)
    own = [keys.worker_queue(model, f"w{i}") for i in range(LIVE_WORKERS)]
    client = bounded_client(redis, pool, 1000, [shared, *own])
    for queue in (shared, own[0], own[7]):
        await client._enqueue(CompletionJob(model=model, prompt="p", priority=2), queue,
                              QueueRoom(1000, (shared, *own)))
    spent = []
    for _ in range(3):
        before = await calls(redis)
        await client._enqueue(CompletionJob(model=model, prompt="p", priority=2), shared,
                              QueueRoom(1000, (shared, *own)))
        spent.append(await calls(redis) - before)
    assert max(spent) <= 25, spent


async def test_the_indexed_count_is_the_queues_count(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """What the index counts as waiting is what the queues hold: jobs of the shared queue and
    of the live workers' own queues that no worker holds, a handed-back one again, a job
    whose lease lapsed again, a job moved to the shared queue still; not a cancelled job, nor
    one on a dead worker's queue."""
    redis, pool, _ = pod
    model = f"index-count-{time.monotonic_ns()}"
    shared = keys.slot_queue(model)
    alive, dead = keys.worker_queue(model, "alive"), keys.worker_queue(model, "dead")
    client = bounded_client(redis, pool, 100, [shared, alive])
    room = QueueRoom(100, (shared, alive))

    async def put(queue: str) -> str:
        job = CompletionJob(model=model, prompt="p", priority=2)
        await client._enqueue(job, queue, room)
        return job.job_id

    async def bound_says() -> int:
        limited = bounded_client(redis, pool, 0, [shared, alive])
        with pytest.raises(Unavailable, match=r"\((\d+) requests wait\)") as refused:
            await limited._enqueue(CompletionJob(model=model, prompt="x", priority=2), shared,
                                   QueueRoom(0, (shared, alive)))
        return int(str(refused.value).split("(")[1].split()[0])

    first = [await put(shared) for _ in range(4)]
    routed = [await put(alive) for _ in range(2)]
    await put(dead)  # its worker is not live: not counted, as before
    assert await bound_says() == 6
    held = await claim(redis, shared, 3)
    assert held == first[:3]
    assert await bound_says() == 3
    await redis.delete(in_progress_key_prefix + held[0])  # handed back
    assert await bound_says() == 4
    await redis.zrem(shared, first[3])  # cancelled while it waited
    assert await bound_says() == 3
    await redis.pexpire(in_progress_key_prefix + held[1], 50)  # its worker died
    await asyncio.sleep(0.2)
    assert await bound_says() == 4
    assert await move_to_shared(redis, model, "alive", routed[0])
    assert await bound_says() == 4
    taken = await claim(redis, shared, 10)
    assert sorted(taken) == sorted([held[0], held[1], routed[0]])
    assert await bound_says() == 1  # routed[1], on the live worker's own queue
    for job_id in taken:  # they end: arq takes them out of the queue
        await redis.zrem(shared, job_id)
        await redis.delete(in_progress_key_prefix + job_id)
    assert await bound_says() == 1
    members = await redis.zrange(index_key(model), 0, -1)
    assert len(members) == 3  # held[2] runs; routed[1] waits; the dead queue's job


async def test_a_renewal_reads_its_jobs_owners_in_one_command(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A worker's renewal of its leases: the owners of all its jobs in one MGET (by chunks of
    500), then the two PEXPIREs of each lease it still holds; a lease another worker took is
    reported lost and not touched."""
    redis, _, _ = pod
    leases = Leases(redis, f"w-{time.monotonic_ns()}")
    jobs = [f"renew-{time.monotonic_ns()}-{i}" for i in range(600)]
    for job_id in jobs:
        leases.held.add(job_id)
        await redis.set(keys.job_owner(job_id), leases.worker_id, px=60_000)
        await redis.set(in_progress_key_prefix + job_id, "1", px=60_000)
    await redis.set(keys.job_owner(jobs[550]), "another", px=60_000)
    assert await leases.renew() == [jobs[550]]  # the script loaded: EVALSHA from here on
    await redis.pexpire(keys.job_owner(jobs[3]), 5_000)
    before = await calls(redis)
    assert await leases.renew() == []
    assert await calls(redis) - before <= 2 * 599 + 5  # before: a GET a job too (3 a job)
    assert 2_000 < await redis.pttl(keys.job_owner(jobs[3])) <= lease_ms()  # renewed
    assert await redis.pttl(in_progress_key_prefix + jobs[3]) <= lease_ms()
    assert await redis.get(keys.job_owner(jobs[550])) == b"another"


async def test_a_waiting_workers_idle_poll_costs_five_commands(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A worker's poll of an empty queue (every --poll-delay, per lane, per worker: the cost
    that grows with the idle workers): Redis's TIME, the order's priorities, the queue's size
    and its place among the waiters; the waiters' expiry only when it begins to wait."""
    redis, _, _ = pod
    queue = keys.slot_queue(f"idle-{time.monotonic_ns()}")
    poll = redis.register_script(CLAIM_JOBS)
    waiting: list[str | int] = [keys.queue_waiters(queue), "wake:me", WAITERS_TTL_MS]
    args: list[str | int] = [arq.utils.timestamp_ms(), 4, in_progress_key_prefix, 60_000,
                             *waiting]
    assert await poll(keys=claim_keys(queue), args=args) == []  # begins to wait
    assert await redis.zrange(keys.queue_waiters(queue), 0, -1) == [b"wake:me"]
    assert await redis.pttl(keys.queue_waiters(queue)) > WAITERS_TTL_MS - 60_000
    before = await calls(redis)
    assert await poll(keys=claim_keys(queue), args=args) == []
    assert await calls(redis) - before <= 5  # before: 6 (a PEXPIRE with every poll)
    assert await redis.zrange(keys.queue_waiters(queue), 0, -1) == [b"wake:me"]


async def test_a_finished_job_leaves_its_queue_in_two_commands(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A worker's end of a job that keeps no result (worker/process/arq_worker.py
    finish_job): out of its queue, its arq keys (in-progress, try count, payload) gone."""
    redis, pool, client = pod
    model = f"finish-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    [job] = await queued(client, model, 1)
    assert await claim(redis, queue, 1) == [job.job_id]
    await redis.incr(retry_key_prefix + job.job_id)  # arq's try count, as its run_job

    async def completion(ctx: dict[str, object]) -> None:
        return None

    worker = WakeableWorker([func(completion, name="completion")], queue_name=queue,
                            redis_pool=pool, keep_result=0, handle_signals=False,
                            job_serializer=serialize_job, job_deserializer=deserialize_job)
    before = await calls(redis)
    await worker.finish_job(job.job_id, True, None, 0, False, None, None)
    assert await calls(redis) - before <= 2  # arq's: MULTI, ZREM abort, ZREM, DEL, EXEC
    assert await redis.zscore(queue, job.job_id) is None
    assert not await redis.exists(in_progress_key_prefix + job.job_id,
                                  retry_key_prefix + job.job_id, job_key_prefix + job.job_id)


async def calls_by_name(redis: Redis) -> dict[str, int]:
    """Commands Redis ran so far by name (`zrange`, `zcard`...), those inside scripts
    included."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def spent_by_name(redis: Redis, before: dict[str, int]) -> dict[str, int]:
    after = await calls_by_name(redis)
    return {name: n - before.get(name, 0) for name, n in after.items()
            if n - before.get(name, 0) and name != "info"}


async def test_a_walk_of_the_order_or_the_index_stops_at_its_last_page(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A page shorter than a whole one is the last (issue 44, sixth pass): the claim reads no
    empty page after it nor the order set's size (ZCARD: it counted the set as it walked), a
    claim that got all it wanted no size at all, and the bound's count of the index no empty
    page either."""
    redis, pool, _ = pod
    model = f"pages-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    client = bounded_client(redis, pool, 100, [queue])
    room = QueueRoom(100, (queue,))
    jobs = [CompletionJob(model=model, prompt="p", priority=2) for _ in range(4)]
    for job in jobs[:3]:
        await client._enqueue(job, queue, room)
    await claim(redis, queue, 0)  # the script loaded: EVALSHA from here on

    before = await calls_by_name(redis)
    assert await claim(redis, queue, 1) == [jobs[0].job_id]  # got all it wanted
    spent = await spent_by_name(redis, before)
    assert spent.get("zrange") == 2 and "zcard" not in spent, spent  # priorities, one page

    before = await calls_by_name(redis)
    assert await claim(redis, queue, 5) == [j.job_id for j in jobs[1:3]]  # the queue ran dry
    spent = await spent_by_name(redis, before)
    assert spent.get("zrange") == 2, spent  # before: 3 (the empty page after the short one)
    assert spent.get("zcard") == 1, spent  # the queue's own; before: the order set's too

    before = await calls_by_name(redis)
    await client._enqueue(jobs[3], queue, room)
    spent = await spent_by_name(redis, before)
    assert spent.get("zrangebyscore") == 1, spent  # before: 2 (the empty page)
    assert await claim(redis, queue, 5) == [jobs[3].job_id]


async def test_an_enqueue_sets_its_keys_expiry_once_a_minute_or_when_they_begin(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """The queue's order sets, the model's fair state and index live a job's TTL: the enqueue
    sets their expiry when a key begins (a new priority, an empty index) and at most once a
    KEY_REFRESH_MS otherwise, not with every job (issue 44, sixth pass: 4 PEXPIREs a job);
    a worker's own queue sets them with every job."""
    redis, pool, _ = pod
    model = f"expiry-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    client = bounded_client(redis, pool, 100, [queue])
    room = QueueRoom(100, (queue,))
    order, fair, index = keys.queue_order(queue), keys.fair_state(model), index_key(model)

    async def pexpires(job: CompletionJob, where: str = queue) -> int:
        before = await calls_by_name(redis)
        await client._enqueue(job, where, room)
        return (await spent_by_name(redis, before)).get("pexpire", 0)

    async def all_expire() -> None:
        for key in (order, f"{order}:2", fair, index):
            assert 0 < await redis.pttl(key) <= keys.JOB_TTL_S * 1000, key

    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2)) == 4
    await all_expire()
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2)) == 0  # before: 4
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=1)) == 2  # new order
    assert 0 < await redis.pttl(f"{order}:1") <= keys.JOB_TTL_S * 1000
    a_minute_ago = str(int(time.time() * 1000) - KEY_REFRESH_MS - 1000)
    await redis.hset(fair, f"x:{queue}", a_minute_ago)  # type: ignore[misc]
    await redis.pexpire(order, 5_000)
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2)) == 4  # a minute on
    await all_expire()
    assert await redis.pttl(order) > 5_000
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2)) == 0

    taken = await claim(redis, queue, 10)  # they all end: the index empties
    assert len(taken) == 5
    for job_id in taken:
        await redis.zrem(queue, job_id)
        await redis.delete(in_progress_key_prefix + job_id)
    # the index begins again (the order sets still hold the ended jobs, dropped by the next
    # claim, and their expiry)
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2)) == 1
    await all_expire()

    own = keys.worker_queue(model, "w1")
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2), own) == 4
    assert await pexpires(CompletionJob(model=model, prompt="p", priority=2), own) == 4


async def test_a_job_waiting_while_no_worker_waits_costs_its_rewake_two_commands(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """scheduler/wake.py Rewakes, once a second for the jobs that wait unclaimed: with no
    worker waiting (all full, the usual reason a job waits) it looks at the waiters first and
    stops (issue 44, sixth pass: the job's queue score and lease were read first, 4 commands);
    with one waiting it still wakes it."""
    redis, _, client = pod
    model = f"rewake-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    [job] = await queued(client, model, 1)
    rewakes = Rewakes(redis)

    async def rewake() -> None:
        rewakes._last = 0.0
        rewakes.ask(queue, job.job_id)
        assert rewakes._task is not None
        await rewakes._task

    await rewake()  # its script loaded
    before = await calls(redis)
    await rewake()
    assert await calls(redis) - before <= 2  # EVALSHA, ZCARD
    await redis.zadd(keys.queue_waiters(queue), {"wake:gone": 1.0})
    await rewake()
    assert await redis.zcard(keys.queue_waiters(queue)) == 0  # popped (nobody heard it)


async def test_the_bound_drops_index_members_past_a_jobs_ttl_only_when_there_are_some(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """The index's members older than a job's TTL (their jobs expired) go when the bound's
    first page shows one (its oldest member), not with a ZREMRANGEBYSCORE every enqueue
    (issue 44, sixth pass); such a member is not counted as waiting."""
    redis, pool, _ = pod
    model = f"index-ttl-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    client = bounded_client(redis, pool, 100, [queue])
    room = QueueRoom(100, (queue,))
    await client._enqueue(CompletionJob(model=model, prompt="p", priority=2), queue, room)
    before = await calls_by_name(redis)
    await client._enqueue(CompletionJob(model=model, prompt="p", priority=2), queue, room)
    assert "zremrangebyscore" not in await spent_by_name(redis, before)  # before: 1
    old = (time.time() - keys.JOB_TTL_S) * 1000 - 5_000
    await redis.zadd(queue, {"expired": old})  # an expired job arq never took out
    await redis.zadd(index_key(model), {f"{queue}\nexpired": old})
    limited = bounded_client(redis, pool, 2, [queue])
    before = await calls_by_name(redis)
    with pytest.raises(Unavailable, match=r"\(2 requests wait\)"):  # not 3
        await limited._enqueue(CompletionJob(model=model, prompt="x", priority=2), queue,
                               QueueRoom(2, (queue,)))
    assert (await spent_by_name(redis, before)).get("zremrangebyscore") == 1
    assert await redis.zscore(index_key(model), f"{queue}\nexpired") is None
