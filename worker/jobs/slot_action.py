"""The body of a slot action (POST /slots/{id}?action=save|restore|erase): a slot's KV saved
to object storage, restored (possibly saved by another worker) or erased; the engine runs it
while the slot is idle (worker/kv/snapshots.py does the KV side)."""

from __future__ import annotations

import asyncio
import time

from scheduler.contract.errors import InvalidRequest, NotFound, NotSupported
from scheduler.contract.jobs import SlotActionJob
from scheduler.contract.results import SlotActionResult
from storage import (
    InvalidKey,
    ObjectNotFound,
    SlotSnapshotStore,
    StorageError,
    StorageUnavailable,
    check_slot_name,
    open_store,
)
from worker.jobs.parts import WorkerParts
from worker.kv.slots import SlotCache
from worker.kv.snapshots import (
    SnapshotMeta,
    check_snapshot,
    erase_slot,
    restore_error,
    restore_slot,
    save_slot,
)


async def run(parts: WorkerParts, job: SlotActionJob) -> None:
    engine, model, settings = parts.engine, parts.model, parts.settings
    if not settings.slot_save_path:
        raise NotSupported(
            "This server does not support slots action. Start it with `--slot-save-path`")
    snapshots = SlotSnapshotStore(await asyncio.to_thread(  # boto3's first import and client:
        open_store, settings.slot_save_path, settings.s3_endpoint_url))  # seconds, off the loop
    if job.action != "erase":
        try:
            check_slot_name(job.filename)
        except InvalidKey:
            raise InvalidRequest("Invalid filename") from None
    started = time.perf_counter()
    if job.action == "save":
        data, tokens = await asyncio.wrap_future(
            engine.run_on_slot(job.id_slot, lambda slot: save_slot(model, slot)))
        meta = SnapshotMeta(model=parts.model_id, tokens=tokens)
        await asyncio.to_thread(snapshots.save, job.filename, data, meta.model_dump())
        n_tokens, n_bytes = len(tokens), len(data)
    elif job.action == "restore":
        try:
            data, stored = await asyncio.to_thread(snapshots.load, job.filename)
        except ObjectNotFound:
            if job.tenant_file:
                raise NotFound("slot save file not found") from None
            raise restore_error(f"no slot save file named {job.filename!r}") from None
        except StorageUnavailable:
            raise
        except StorageError:  # unreadable metadata
            raise restore_error("invalid slot save file") from None
        tokens = check_snapshot(stored, parts.model_id).tokens
        def restore(slot: SlotCache) -> int:
            read = restore_slot(model, slot, data, tokens)
            slot.salt = job.cache_salt  # it serves its restorer's tenant group
            return read

        n_bytes = await asyncio.wrap_future(engine.run_on_slot(job.id_slot, restore))
        n_tokens = len(tokens)
    else:
        n_tokens = await asyncio.wrap_future(
            engine.run_on_slot(job.id_slot, lambda slot: erase_slot(model, slot)))
        n_bytes = 0
    parts.final(job.job_id, SlotActionResult(
        action=job.action, id_slot=job.id_slot, filename=job.filename, n_tokens=n_tokens,
        n_bytes=n_bytes, ms=(time.perf_counter() - started) * 1000))
