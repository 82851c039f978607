"""One batch's run, from where it stands to a final state: its input read and checked, its
lines cut into chunks run a few at a time (each chunk's results one object in the store), and
at the end the chunks concatenated into the output and error files. The pod's batch driver
(api/batch/driver.py) starts a run for each batch it holds the lease of."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import tempfile
from pathlib import Path
from typing import Protocol

from redis.exceptions import RedisError

from api.batch.embeddings import run_embedding_chunk
from api.batch.input import BatchInput, BatchLine, BatchLines, read_input_file
from api.batch.lines import LineResult, run_line, unrun_line
from api.endpoints.batches.served import CHUNK_ENDPOINTS
from api.endpoints.openai.context import OpenAIContext
from api.fleet import Fleet
from api.settings import ApiSettings
from api.tenants.service import CURRENT, TenantService
from scheduler.batches import (
    COMPLETION_WINDOW_S,
    BatchError,
    BatchErrors,
    Batches,
    BatchPlan,
    BatchRecord,
    RequestCounts,
    now,
)
from scheduler.contract import keys
from storage import ObjectNotFound, ObjectStore
from storage.files import ChunkResult, ChunkStore, FileStore, StoredFile

log = logging.getLogger(__name__)

CHUNK_LINES_MIN = 16
CHUNK_LINES_MAX = 256
CHUNK_PER_SLOT = 4
"""A chunk holds this many lines per slot of the largest worker (so one fills its batch)."""
EMBEDDING_CHUNK_LINES = 64
"""Lines of a /v1/embeddings chunk (one background job with all their inputs)."""
OPEN_CHUNKS = 4
"""Chunks of one batch running at once."""
IN_FLIGHT_PER_SLOT = 2
"""Lines of one batch submitted at once, per live slot of the fleet (the rest wait here, not in
Redis, so that a cancel has little to take back)."""
WATCH_EVERY_S = 1.0
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same however often it is finalized."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class BatchPod(Protocol):
    """What a run uses of the pod that drives it (api/batch/driver.py BatchDriver)."""

    fleet: Fleet
    settings: ApiSettings
    store: ObjectStore
    tenants: TenantService | None
    batches: Batches
    files: FileStore
    chunks: ChunkStore


class BatchRun:
    """One driver's run of one batch, from where it stands to a final state (or until the
    driver loses its lease or stops)."""

    def __init__(self, driver: BatchPod, batch_id: str) -> None:
        self.driver = driver
        self.batches = driver.batches
        self.batch_id = batch_id
        self.stop = asyncio.Event()
        """Set when the batch is cancelled or expires: no new chunk starts."""
        self.owner = "default"
        """The tenant whose batch it is (its output files are its too)."""

    async def run(self) -> None:
        record = await self.batches.get(self.batch_id)
        if record.final:
            return
        self.owner = record.owner
        tenants = self.driver.tenants
        if tenants is not None and tenants.directory.enabled:  # its (and its chunks') tenant
            CURRENT.set(tenants.scope(tenants.directory.by_name(record.owner), enforce=False))
        with tempfile.TemporaryDirectory(prefix="llamaq-batch-input-") as folder:
            parsed = await self._read_input(record, Path(folder) / "input.jsonl")
            if parsed.errors and record.status != "validating":  # its input went mid-run
                log.warning("batch %s: its input file is gone or unreadable: failed",
                            self.batch_id)
                await self.batches.update(self.batch_id, lambda r: failed_record(r, parsed.errors))
                return
            if record.status == "validating":
                record = await self._validated(record, parsed)
                if record.final:
                    return
            if record.status == "in_progress":
                await self._run_chunks(record, parsed.lines)
            await self._finalize(parsed.lines)

    async def _read_input(self, record: BatchRecord, path: Path) -> BatchInput:
        """The input file, copied to `path` (kept there while the batch runs: its lines are
        read from it chunk by chunk) and read line by line (never held whole)."""
        try:
            await asyncio.to_thread(self.driver.files.content_to, record.input_file_id, path)
        except ObjectNotFound:
            parsed = BatchInput()
            parsed.fail("invalid_file", f"The input file {record.input_file_id} is gone.")
            return parsed
        return await asyncio.to_thread(read_input_file, path, record.endpoint)

    async def _validated(self, record: BatchRecord, parsed: BatchInput) -> BatchRecord:
        if parsed.errors:
            log.info("batch %s: failed validation (%d errors)", self.batch_id,
                     len(parsed.errors))
            return await self.batches.update(self.batch_id,
                                             lambda r: failed_record(r, parsed.errors))
        workers = await self.driver.fleet.workers(self.driver.settings.model_id())
        slots = max((w.n_slots for w in workers), default=0)
        chunk = min(CHUNK_LINES_MAX, max(CHUNK_LINES_MIN, CHUNK_PER_SLOT * slots))
        if record.endpoint in CHUNK_ENDPOINTS:  # one job per chunk: a worker's whole batch
            chunk = EMBEDDING_CHUNK_LINES
        plan = BatchPlan(lines=len(parsed.lines), chunk_size=chunk)
        model = parsed.model or self.driver.settings.model_id()

        def start(r: BatchRecord) -> BatchRecord | None:
            if r.status not in ("validating", "cancelling"):
                return None
            r.plan, r.model = plan, model
            r.request_counts = RequestCounts(total=plan.lines)
            if r.status == "validating":
                r.status, r.in_progress_at = "in_progress", now()
            return r

        record = await self.batches.update(self.batch_id, start)
        log.info("batch %s: %d lines in %d chunks of %d", self.batch_id, plan.lines,
                 plan.n_chunks, plan.chunk_size)
        return record

    async def _run_chunks(self, record: BatchRecord, lines: BatchLines) -> None:
        plan = record.plan
        done = set((await self.batches.progress(self.batch_id)).chunks)
        todo = [i for i in range(plan.n_chunks) if i not in done]
        model_id = record.fleet_model or self.driver.settings.model_id()
        context = OpenAIContext(None, self.driver.fleet, self.driver.settings,
                                queue=keys.batch_queue(model_id), model=model_id,
                                media_store=self.driver.store)
        limit = _Limit()
        watcher = asyncio.create_task(self._watch(record, limit))
        running: set[asyncio.Task[None]] = set()
        stopped = asyncio.create_task(self.stop.wait())
        try:
            for index in todo:
                while len(running) >= OPEN_CHUNKS and not self.stop.is_set():
                    finished, _ = await asyncio.wait({*running, stopped},
                                                     return_when=asyncio.FIRST_COMPLETED)
                    for task in finished - {stopped}:
                        running.discard(task)
                        task.result()
                await self._wait_for_workers()
                if self.stop.is_set():
                    break
                chunk_lines = await asyncio.to_thread(lines.take, plan.chunk_lines(index))
                running.add(asyncio.create_task(
                    self._chunk(index, chunk_lines, record.endpoint, context, limit)))
            while running and not self.stop.is_set():
                finished, _ = await asyncio.wait({*running, stopped},
                                                 return_when=asyncio.FIRST_COMPLETED)
                for task in finished - {stopped}:
                    running.discard(task)
                    task.result()
        finally:
            for task in (*running, watcher, stopped):
                task.cancel()
            await asyncio.gather(*running, watcher, stopped, return_exceptions=True)

    async def _wait_for_workers(self) -> None:
        """A chunk starts only while the model has a live worker: with none, its lines would
        fail ("Loading model") instead of waiting."""
        model_id = self.driver.settings.model_id()
        while not self.stop.is_set() and not await self.driver.fleet.workers(model_id):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), WATCH_EVERY_S)

    async def _watch(self, record: BatchRecord, limit: _Limit) -> None:
        """Cancel and expiry (from any pod, any time), and the fleet's size (lines in
        flight follow the live slots)."""
        while True:
            try:
                current = await self.batches.get(self.batch_id)
                workers = await self.driver.fleet.workers(self.driver.settings.model_id())
            except RedisError as error:  # Redis away: the lines wait too; look again soon
                log.warning("batch %s: cannot read its record (%s)", self.batch_id, error)
                await asyncio.sleep(WATCH_EVERY_S)
                continue
            if current.status == "cancelling":
                log.info("batch %s: cancelling", self.batch_id)
                self.stop.set()
            if now() >= (current.expires_at or current.created_at + COMPLETION_WINDOW_S):
                log.info("batch %s: expired", self.batch_id)
                self.stop.set()
            await limit.resize(IN_FLIGHT_PER_SLOT * sum(w.n_slots for w in workers))
            await asyncio.sleep(WATCH_EVERY_S)

    async def _chunk(self, index: int, lines: list[BatchLine], endpoint: str,
                     context: OpenAIContext, limit: _Limit) -> None:
        async def one(line: BatchLine) -> LineResult:
            async with limit:
                return await run_line(context, endpoint, line)

        if endpoint in CHUNK_ENDPOINTS:
            async with limit:
                results = await run_embedding_chunk(context, lines)
        else:
            results = await asyncio.gather(*(one(line) for line in lines))
        chunk = ChunkResult(output=[r.text for r in results if r.ok],
                            errors=[r.text for r in results if not r.ok])
        await asyncio.to_thread(self.driver.chunks.put, self.batch_id, index, chunk)
        await self.batches.chunk_done(self.batch_id, index, len(chunk.output),
                                      len(chunk.errors))

    async def _finalize(self, lines: BatchLines) -> None:
        def finalizing(r: BatchRecord) -> BatchRecord | None:
            if r.status != "in_progress":
                return None
            r.status, r.finalizing_at = "finalizing", now()
            return r

        record = await self.batches.update(self.batch_id, finalizing)
        if record.final:
            return
        progress = await self.batches.progress(self.batch_id)
        plan = record.plan
        expires_at = record.expires_at or record.created_at + COMPLETION_WINDOW_S
        unfinished = [i for i in range(plan.n_chunks) if i not in progress.chunks]
        expired = bool(unfinished) and record.status != "cancelling" and now() >= expires_at
        counts = RequestCounts(total=plan.lines, completed=progress.completed,
                               failed=progress.failed)
        with tempfile.TemporaryDirectory(prefix="llamaq-batch-") as folder:
            output, errors = Path(folder) / "output.jsonl", Path(folder) / "errors.jsonl"
            n_output, n_errors = await asyncio.to_thread(
                self._concatenate, plan, progress.chunks, lines if expired else None, output,
                errors)
            counts.failed += n_errors - progress.failed  # lines the window cut off
            output_id = await self._store_result(output, n_output, "output")
            error_id = await self._store_result(errors, n_errors, "errors")

        def final(r: BatchRecord) -> BatchRecord | None:
            if r.final:
                return None
            at = now()
            if r.status == "cancelling":
                r.status, r.cancelled_at = "cancelled", at
            elif expired:
                r.status, r.expired_at = "expired", at
            else:
                r.status, r.completed_at = "completed", at
            r.output_file_id, r.error_file_id, r.request_counts = output_id, error_id, counts
            return r

        record = await self.batches.update(self.batch_id, final)
        log.info("batch %s: %s (%d completed, %d failed)", self.batch_id, record.status,
                 counts.completed, counts.failed)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.driver.chunks.delete_all, self.batch_id)

    def _concatenate(self, plan: BatchPlan, done: dict[int, tuple[int, int]],
                     expired_lines: BatchLines | None, output: Path,
                     errors: Path) -> tuple[int, int]:
        """Chunks in order into the two files; with `expired_lines`, the lines of unfinished
        chunks become batch_expired errors."""
        n_output = n_errors = 0
        with output.open("w", encoding="utf-8") as out, errors.open("w", encoding="utf-8") as err:
            for index in range(plan.n_chunks):
                if index in done:
                    chunk = self.driver.chunks.get(self.batch_id, index)
                    lines_out, lines_err = chunk.output, chunk.errors
                elif expired_lines is not None:
                    lines_out = []
                    lines_err = [unrun_line(line.custom_id, "batch_expired", EXPIRED_MESSAGE)
                                 for line in expired_lines.take(plan.chunk_lines(index))]
                else:
                    continue
                for text in lines_out:
                    out.write(text + "\n")
                for text in lines_err:
                    err.write(text + "\n")
                n_output += len(lines_out)
                n_errors += len(lines_err)
        return n_output, n_errors

    async def _store_result(self, path: Path, n_lines: int, kind: str) -> str | None:
        if not n_lines:
            return None
        meta = StoredFile(id=result_file_id(self.batch_id, kind), bytes=path.stat().st_size,
                          created_at=now(), filename=f"{self.batch_id}_{kind}.jsonl",
                          purpose="batch_output", owner=self.owner)
        await asyncio.to_thread(self.driver.files.put_path, meta, path)
        return meta.id


def failed_record(record: BatchRecord, errors: list[BatchError]) -> BatchRecord | None:
    """`record` failed with `errors` (an update of scheduler/batches.py: None leaves a final
    record as it is)."""
    if record.final:
        return None
    record.status, record.failed_at = "failed", now()
    record.errors = BatchErrors(data=errors)
    return record


class _Limit:
    """A semaphore whose size follows the fleet (lines of one batch in flight)."""

    MIN = 4

    def __init__(self) -> None:
        self._size = self.MIN
        self._held = 0
        self._changed = asyncio.Condition()

    async def resize(self, size: int) -> None:
        async with self._changed:
            self._size = max(self.MIN, size)
            self._changed.notify_all()

    async def __aenter__(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._held < self._size)
            self._held += 1

    async def __aexit__(self, *_: object) -> None:
        async with self._changed:
            self._held -= 1
            self._changed.notify_all()
