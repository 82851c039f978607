"""The batch driver: every api pod runs one; each active batch is driven by exactly one pod at a
time, the holder of its lease in Redis (scheduler/batches.py). A pod that dies or stops lets the
lease lapse (or lets it go) and another pod takes the batch over where it stood: finished chunks
are in the store and in Redis, a chunk that was running runs again and replaces its object.

A batch runs (api/batch/run.py) as chunks of consecutive lines. A chunk's lines are ordinary
jobs on the model's batch queue, which a worker takes only when online jobs leave it room
(worker/process/arq_worker.py), so a dead worker's lines run again through the job leases. A
finished chunk's output and error lines are one object in the store (keyed by chunk); when
every chunk is done, or the batch is cancelled or expires, the chunks are concatenated in order
into the output and error files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from redis.exceptions import RedisError

from api.batch.run import BatchRun, failed_record
from api.fleet import Fleet
from api.settings import ApiSettings
from api.tenants.service import TenantService
from scheduler.batches import (
    MAX_FAILED_RUNS,
    BatchError,
    Batches,
    BatchRecord,
    retry_delay_s,
)
from scheduler.contract import keys
from scheduler.contract.errors import NotFound
from storage import ObjectStore
from storage.files import ChunkStore, FileStore

log = logging.getLogger(__name__)

MAX_DRIVEN = 4
"""Batches one pod drives at once (each holds its input in memory); the others are left to
other pods, or wait for one of these to end."""


class BatchDriver:
    def __init__(self, fleet: Fleet, settings: ApiSettings, store: ObjectStore,
                 tenants: TenantService | None = None) -> None:
        """`tenants`: a batch's lines run as its owner's (tokens counted, limits not
        applied: the batch lane paces them)."""
        self.fleet = fleet
        self.tenants = tenants
        self.settings = settings
        self.batches = Batches(fleet.redis)
        self.files = FileStore(store)
        self.chunks = ChunkStore(store)
        self.store = store
        self.token = secrets.token_hex(8)
        self._driving: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Look for batches nobody drives, for the pod's lifetime."""
        while True:
            try:
                for batch_id in await self.batches.active(self.settings.model_id()):
                    if batch_id in self._driving:
                        continue
                    if len(self._driving) >= MAX_DRIVEN:
                        break  # the others are left to other pods (or to the next scan)
                    if await self._backing_off(batch_id):
                        continue
                    if await self.batches.take(batch_id, self.token):
                        log.info("batch %s: driven by this pod (%s)", batch_id, self.token)
                        task = asyncio.create_task(self._drive(batch_id))
                        self._driving[batch_id] = task
                        task.add_done_callback(self._forget)
            except RedisError as error:
                log.warning("batch driver: cannot read Redis (%s); retrying", error)
            await asyncio.sleep(keys.BATCH_SCAN_EVERY_S)

    def _forget(self, task: asyncio.Task[None]) -> None:
        for batch_id, running in list(self._driving.items()):
            if running is task:
                del self._driving[batch_id]

    async def close(self) -> None:
        """Stop driving (a pod that stops): another pod takes the batches over at once."""
        tasks = list(self._driving.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drive(self, batch_id: str) -> None:
        work = asyncio.create_task(BatchRun(self, batch_id).run())
        try:
            while not work.done():
                await asyncio.wait([work], timeout=keys.BATCH_RENEW_EVERY_S)
                if work.done():
                    break
                try:
                    held = await self.batches.renew(batch_id, self.token)
                except RedisError as error:
                    log.warning("batch %s: cannot renew the lease (%s)", batch_id, error)
                    continue
                if not held:
                    log.error("batch %s: lease lost; another pod drives it now", batch_id)
                    work.cancel()
            await work
        except asyncio.CancelledError:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            raise
        except Exception as error:  # logged; retried after a backoff, and failed past a bound
            log.exception("batch %s: driver failed", batch_id)
            with contextlib.suppress(RedisError, NotFound):
                await self._count_failed_run(batch_id, error)
        finally:
            with contextlib.suppress(RedisError):
                await asyncio.shield(self.batches.let_go(batch_id, self.token))


    async def _backing_off(self, batch_id: str) -> bool:
        """The batch's last run failed and it waits its backoff out (or it is gone)."""
        try:
            return (await self.batches.get(batch_id)).retry_at > time.time()
        except NotFound:
            return True

    async def _count_failed_run(self, batch_id: str, error: Exception) -> None:
        """A run that failed waits longer each time before a driver takes the batch up
        again; past MAX_FAILED_RUNS the batch fails, with an error the API shows."""
        def count(r: BatchRecord) -> BatchRecord | None:
            if r.final:
                return None
            r.failed_runs += 1
            if r.failed_runs >= MAX_FAILED_RUNS:
                message = (f"The batch could not be run: {r.failed_runs} attempts failed, "
                           f"the last with {type(error).__name__}.")
                return failed_record(r, [BatchError(code="batch_failed", message=message)])
            r.retry_at = time.time() + retry_delay_s(r.failed_runs)
            return r

        record = await self.batches.update(batch_id, count)
        if record.final:
            log.error("batch %s: failed after %d runs", batch_id, record.failed_runs)
        else:
            log.warning("batch %s: run %d failed; retried in %.0f s", batch_id,
                        record.failed_runs, record.retry_at - time.time())
