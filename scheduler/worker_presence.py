"""A dead worker seen at once: every worker names its Redis connections (client_name)
and holds one open for good (its pub/sub listener), so a worker whose process ended (SIGKILL, an
OOM kill, a crash: the kernel closes its sockets) has no connection in Redis's CLIENT LIST within
milliseconds, seconds before its 3 s leases lapse. An api pod that waits on silent jobs asks
whether their owners still have a connection (scheduler/silent_jobs.py); one missing at two
looks keys.GONE_FOR_S apart has died, and its jobs' leases are taken from it (`take_lease`:
a job's owner key and arq's in-progress key, only while that worker still holds them), so
they run again or continue on another worker now. A machine that vanishes (no FIN) keeps its
connections until TCP keepalive ends them: its leases lapse as before. Where CLIENT LIST is
refused (a managed Redis may forbid it), only the leases tell.

Owns: the pod's view of which workers hold a connection (one CLIENT LIST per REFRESH_S for all
of a pod's silent jobs), and the taking of a dead worker's lease."""

from __future__ import annotations

import asyncio
import logging
import time

from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from scheduler.contract import keys

log = logging.getLogger(__name__)

def client_name(worker_id: str) -> str:
    """The name (CLIENT SETNAME) of every Redis connection of a worker."""
    return f"llamaq-worker-{worker_id}"


REFRESH_S = 0.2
"""A pod lists Redis's clients at most this often."""

TAKE_LEASE = """
-- KEYS[1]: a job's owner key, KEYS[2]: arq's in-progress key of the job; ARGV[1]: the worker
-- seen dead. Deletes both while that worker still owns the job.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


class WorkerPresence:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._names: frozenset[str] = frozenset()
        self._listed_at = -1.0
        self._refused = False
        self._listing: asyncio.Lock = asyncio.Lock()
        self._take = redis.register_script(TAKE_LEASE)

    async def connected(self, worker_id: str) -> bool | None:
        """Whether the worker holds a Redis connection now (None: CLIENT LIST is refused)."""
        async with self._listing:
            if self._refused:
                return None
            if time.monotonic() - self._listed_at >= REFRESH_S:
                try:
                    clients = await self._redis.client_list()
                except ResponseError as error:  # ACLs: leases only
                    log.warning("CLIENT LIST refused (%s): dead workers are seen when their "
                                "leases lapse", error)
                    self._refused = True
                    return None
                self._names = frozenset(str(c.get("name", "")) for c in clients)
                self._listed_at = time.monotonic()
        return client_name(worker_id) in self._names

    async def take_lease(self, job_id: str, worker_id: str) -> bool:
        """End the lease `worker_id` holds on the job (it died); False if it holds none."""
        taken = await self._take(keys=[keys.job_owner(job_id), in_progress_key_prefix + job_id],
                                 args=[worker_id])
        return bool(taken)
