"""Model downloads as the fleet sees them: a record per unfinished download in Redis (listed as
`downloading` while its downloader is alive, else `incomplete`), the spec's `/models/sse`
download events on the models channel, and the pause flag a downloader obeys."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from pydantic import Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from storage.errors import DownloadCancelled, StorageError
from storage.progress import DownloadListener

log = logging.getLogger(__name__)

T = TypeVar("T")


class FileProgress(DeferredModel):
    done: int = 0
    total: int = 0


class DownloadRecord(DeferredModel):
    """An unfinished download: what was asked for and how far each file got."""

    model: str
    sidecars: list[str] = Field(default_factory=list)
    progress: dict[str, FileProgress] = Field(default_factory=dict)
    error: str | None = None
    updated_at: float = Field(default_factory=time.time)


class ModelEvent(DeferredModel):
    """One event of the spec's `GET /models/sse` (`{"model", "event", "data"?}`)."""

    model: str
    event: str
    data: dict[str, Any] | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class DownloadStatus(DeferredModel):
    """The `status` object GET /models shows for a model being (or left half) downloaded."""

    value: Literal["downloading", "incomplete"]
    progress: dict[str, FileProgress] = Field(default_factory=dict)
    sidecars: list[str] = Field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        if self.value == "downloading":
            return {"value": "downloading",
                    "progress": {url: p.model_dump() for url, p in self.progress.items()}}
        return {"value": "incomplete", "args": []}


def incomplete_sidecars(status: DownloadStatus | None, stored: tuple[str, ...]) -> list[str]:
    """The spec's `incomplete_sidecars` of a model: the kinds its last unfinished download was
    asked for that the store does not hold yet (`stored`: StoredModel.sidecars)."""
    if status is None or status.value != "incomplete":
        return []
    return [kind for kind in status.sidecars if kind not in stored]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class DownloadBoard:
    """The downloads' state in Redis, shared by every api pod and worker."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def publish(self, event: ModelEvent) -> None:
        await self.redis.publish(keys.MODELS_CHANNEL, event.to_json())

    async def begin(self, model: str, sidecars: list[str]) -> DownloadRecord:
        """Start (or resume) a download: the record keeps the progress of the files so far."""
        raw = await self.redis.get(keys.download_record(model))
        record = (DownloadRecord.model_validate_json(raw) if raw
                  else DownloadRecord(model=model))
        record.sidecars = sorted(set(record.sidecars) | set(sidecars))
        record.error = None
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.download_stop(model))
            pipe.set(keys.download_alive(model), "1", ex=keys.DOWNLOAD_ALIVE_TTL_S)
            pipe.set(keys.download_record(model), record.model_dump_json())
            pipe.sadd(keys.DOWNLOADS, model)
            await pipe.execute()
        return record

    async def report(self, record: DownloadRecord) -> bool:
        """Write the progress and publish a download_progress event; True when a pause was
        asked for."""
        record.updated_at = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.download_record(record.model), record.model_dump_json())
            pipe.set(keys.download_alive(record.model), "1", ex=keys.DOWNLOAD_ALIVE_TTL_S)
            pipe.sadd(keys.DOWNLOADS, record.model)
            pipe.exists(keys.download_stop(record.model))
            results = await pipe.execute()
        data = {url: p.model_dump() for url, p in record.progress.items()}
        await self.publish(ModelEvent(model=record.model, event="download_progress", data=data))
        return bool(results[-1])

    async def finish(self, model: str) -> None:
        await self.forget(model)
        await self.publish(ModelEvent(model=model, event="download_finished"))

    async def fail(self, record: DownloadRecord, error: str) -> None:
        """The download stopped unfinished (failed or paused): listed as incomplete."""
        record.error = error
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.download_record(record.model), record.model_dump_json())
            pipe.delete(keys.download_alive(record.model), keys.download_stop(record.model))
            await pipe.execute()
        await self.publish(ModelEvent(model=record.model, event="download_failed"))

    async def forget(self, model: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.download_record(model), keys.download_alive(model),
                        keys.download_stop(model))
            pipe.srem(keys.DOWNLOADS, model)
            await pipe.execute()

    async def running(self) -> int:
        """How many downloads run now, fleet-wide (their downloaders are alive)."""
        members = await self.redis.smembers(keys.DOWNLOADS)  # type: ignore[misc]
        if not members:
            return 0
        return int(await self.redis.exists(*[keys.download_alive(_text(m)) for m in members]))

    async def is_downloading(self, model: str) -> bool:
        return bool(await self.redis.exists(keys.download_alive(model)))

    async def request_stop(self, model: str) -> bool:
        """Ask the model's downloader to pause (its partial files stay, the model is listed as
        incomplete); False when no download of it runs."""
        if not await self.is_downloading(model):
            return False
        await self.redis.set(keys.download_stop(model), "1", ex=keys.DOWNLOAD_ALIVE_TTL_S)
        return True

    async def wait_stopped(self, model: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while await self.is_downloading(model):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def record(self, model: str) -> DownloadRecord | None:
        raw = await self.redis.get(keys.download_record(model))
        return DownloadRecord.model_validate_json(raw) if raw else None

    async def statuses(self) -> dict[str, DownloadStatus]:
        """Every model with an unfinished download and its status (for GET /models)."""
        members = await self.redis.smembers(keys.DOWNLOADS)  # type: ignore[misc]
        models = sorted(_text(m) for m in members)
        if not models:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.get(keys.download_record(model))
                pipe.exists(keys.download_alive(model))
            results = await pipe.execute()
        found: dict[str, DownloadStatus] = {}
        for i, model in enumerate(models):
            raw, alive = results[2 * i], results[2 * i + 1]
            if not raw:
                continue
            record = DownloadRecord.model_validate_json(raw)
            found[model] = DownloadStatus(value="downloading" if alive else "incomplete",
                                          progress=record.progress, sidecars=record.sidecars)
        return found


class DownloadReporter:
    """A storage DownloadListener (called from the download's thread) that reports to the
    board from the event loop, at most every DOWNLOAD_REPORT_EVERY_S, and hears pauses. The
    record is written at start() or with the first bytes: resolving a file already at hand
    publishes nothing."""

    def __init__(self, board: DownloadBoard, model: str, loop: asyncio.AbstractEventLoop, *,
                 sidecars: list[str] | None = None, stoppable: bool = True) -> None:
        self.board = board
        self.record = DownloadRecord(model=model, sidecars=sidecars or [])
        self.loop = loop
        self.stoppable = stoppable
        self.begun = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = 0.0
        self._pending: Future[bool] | None = None

    async def start(self) -> None:
        """Write the record now (listed as downloading before the first byte)."""
        self.record = await self.board.begin(self.record.model, self.record.sidecars)
        self.begun = True

    def on_progress(self, source: str, done: int, total: int) -> None:
        with self._lock:
            self.record.progress[source] = FileProgress(done=done, total=total)
            now = time.monotonic()
            due = now - self._last >= keys.DOWNLOAD_REPORT_EVERY_S or (total and done >= total)
            if not due or (self._pending is not None and not self._pending.done()):
                return
            self._last = now
            snapshot = self.record.model_copy(deep=True)
            self._pending = asyncio.run_coroutine_threadsafe(self._report(snapshot), self.loop)

    async def _report(self, snapshot: DownloadRecord) -> bool:
        try:
            if not self.begun:
                kept = await self.board.begin(snapshot.model, snapshot.sidecars)
                self.begun = True
                snapshot.progress = {**kept.progress, **snapshot.progress}
            stop = await self.board.report(snapshot)
        except RedisError as exc:  # the download goes on; only its reports are lost
            log.warning("model %s: cannot report download progress (%s)", snapshot.model, exc)
            return False
        if stop and self.stoppable:
            self._stop.set()
        return stop

    def cancelled(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Pause the download from this process (its partial files stay)."""
        self._stop.set()

    async def run(self, download: Callable[[DownloadListener], T]) -> T:
        """Run `download(self)` in a thread, with the record and events around it."""
        try:
            result = await asyncio.to_thread(download, self)
        except StorageError as exc:
            await self._settle()
            if self.begun:
                paused = isinstance(exc, DownloadCancelled)
                log.log(logging.INFO if paused else logging.ERROR, "model %s: download %s: %s",
                        self.record.model, "paused" if paused else "failed", exc)
                with contextlib.suppress(RedisError):  # the record expires into `incomplete`
                    await self.board.fail(self.record, str(exc))
            raise
        await self._settle()
        if self.begun:
            try:
                await self.board.finish(self.record.model)
            except RedisError as exc:  # the file is here; only the fleet's record is stale
                log.warning("model %s: cannot record the finished download (%s)",
                            self.record.model, exc)
        return result

    async def _settle(self) -> None:
        """Wait for the report in flight, then publish the last progress (a report that was
        due while another was in flight was skipped)."""
        with self._lock:
            pending = self._pending
        if pending is not None:
            await asyncio.wrap_future(pending)
        if self.begun:
            with contextlib.suppress(RedisError):
                await self.board.report(self.record.model_copy(deep=True))
