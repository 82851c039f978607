"""The router's model state on Redis: host workers, their commands, failed loads, the LRU
clock, `/models/sse` events, and the status of a model (`status_of`).

Hosts (workers started without a model) write their own `HostInfo` with every heartbeat; an
api pod that places a model (scheduler/placement.py decides, `place_model` writes the result)
leaves a short-lived *claim* on the chosen host until the host reports the state itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError
from redis.asyncio import Redis

from scheduler.catalog import ModelEntry
from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import Unavailable
from scheduler.downloads import DownloadBoard, DownloadStatus
from scheduler.placement import HostState, HostView, LoadPlan, Placement
from scheduler.redis_clock import recent
from scheduler.registry import Registry, WorkerInfo, fleet_sleeping

log = logging.getLogger(__name__)

LOCK_WAIT_S = 10.0
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class HostInfo(DeferredModel):
    """A host worker as it reports itself (router mode)."""

    host_id: str
    state: HostState
    model: str | None = None
    args: list[str] = Field(default_factory=list)
    since: float = 0.0
    progress: dict[str, Any] | None = None
    """Loading stages (the spec's `progress`), or per-file download progress."""


class HostCommand(DeferredModel):
    op: Literal["load", "unload"]
    entry: ModelEntry | None = None
    """The model to load (`load` only)."""


class ModelFailure(DeferredModel):
    """The last failed load of a model: its exit code and command line."""

    exit_code: int
    args: list[str] = Field(default_factory=list)
    message: str = ""


class ModelStatus(DeferredModel):
    """`status` of a /models item, exactly as the spec shows each value."""

    value: str
    args: list[str] | None = None
    failed: bool | None = None
    exit_code: int | None = None
    progress: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Claim(DeferredModel):
    model: str | None
    """The model the host was given; None: it was told to unload."""


@dataclass
class FleetView:
    """What one read of Redis shows of the router's models (for one /models listing)."""

    hosts: list[HostInfo] = field(default_factory=list)
    claims: dict[str, Claim] = field(default_factory=dict)
    failures: dict[str, ModelFailure] = field(default_factory=dict)
    pinned: dict[str, list[WorkerInfo]] = field(default_factory=dict)
    """Live workers started with -m, per model."""
    idle: dict[str, bool] = field(default_factory=dict)
    """Per host: nothing processing, nothing queued."""
    downloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per model: a download in progress, `{url: {done, total}}` (filled by whoever runs
    downloads: `status_of` shows it as `downloading`)."""
    incomplete: set[str] = field(default_factory=set)
    """Models whose download stopped before the end (`status_of`: `incomplete`)."""
    sleeping: set[str] = field(default_factory=set)
    """Models every live worker of which sleeps (--sleep-idle-seconds): `sleeping`, not
    `loaded`."""
    download_status: dict[str, DownloadStatus] = field(default_factory=dict)
    """The download status of each model that has one (for `incomplete_sidecars`)."""

    def host_views(self) -> list[HostView]:
        views = []
        for host in self.hosts:
            state, model = host.state, host.model
            claim = self.claims.get(host.host_id)
            if claim is not None:
                state = HostState.LOADING if claim.model else HostState.UNLOADING
                model = claim.model or model
            views.append(HostView(host.host_id, state, model, self.idle.get(host.host_id, True),
                                  host.since))
        return views


def status_of(name: str, entry: ModelEntry | None, view: FleetView) -> ModelStatus:
    """The status of model `name`, the one place that decides it, in this order: a host or a
    pinned worker serving it (`loaded`; `sleeping` and `loading` by the state a host reports,
    with its loading `progress`), a download (`downloading` with per-file progress,
    `incomplete`: `view.downloads` / `view.incomplete`), a failed load (`unloaded`, `failed`,
    `exit_code`), else `unloaded`."""
    args = entry.args() if entry is not None else []
    hosts = {h.host_id: h for h in view.hosts}
    states: list[tuple[HostState, HostInfo | None]] = []
    for host_view in view.host_views():
        if host_view.model == name and host_view.state is not HostState.FREE:
            states.append((host_view.state, hosts.get(host_view.host_id)))
    if view.pinned.get(name):
        states.append((HostState.LOADED, None))
    if name in view.sleeping:  # loaded, but every worker of it unloaded it while idle
        states = [(HostState.SLEEPING if s is HostState.LOADED else s, i) for s, i in states]
    by_state = {state: info for state, info in states}
    for state in (HostState.LOADED, HostState.SLEEPING, HostState.LOADING):
        if state in by_state:
            info = by_state[state]
            status = ModelStatus(value=state.value, args=info.args if info and info.args
                                 else args)
            if state is HostState.LOADING and info is not None and info.progress:
                status.progress = info.progress
            return status
    if name in view.downloads:
        return ModelStatus(value="downloading", progress=view.downloads[name])
    if name in view.incomplete and entry is None:  # a loadable model stays unloaded (its
        return ModelStatus(value="incomplete", args=[])  # missing sidecars are listed apart)
    failure = view.failures.get(name)
    if failure is not None:
        return ModelStatus(value="unloaded", args=failure.args or args, failed=True,
                           exit_code=failure.exit_code)
    return ModelStatus(value="unloaded")


class FleetModels:
    """Reads and writes the router's model state on Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.registry = Registry(redis)

    # -- reading --------------------------------------------------------------------------

    async def hosts(self) -> list[HostInfo]:
        ids = await recent(self.redis, keys.HOSTS, keys.HEARTBEAT_TTL_S)
        if not ids:
            return []
        docs = await self.redis.mget([keys.host_info(i) for i in ids])
        hosts = []
        for doc in docs:
            if doc is None:
                continue
            try:
                hosts.append(HostInfo.model_validate_json(doc))
            except ValidationError:
                log.warning("unreadable host entry %r", doc[:200])
        return hosts

    async def view(self, models: list[str]) -> FleetView:
        """One read of everything `status_of` and the placement need, for `models`."""
        hosts = await self.hosts()
        host_ids = {h.host_id for h in hosts}
        view = FleetView(hosts=hosts)
        for name, download in (await DownloadBoard(self.redis).statuses()).items():
            if download.value == "downloading":
                view.downloads[name] = download.to_wire()["progress"]
            else:
                view.incomplete.add(name)
            view.download_status[name] = download
        if hosts:
            claims = await self.redis.mget([keys.host_claim(h.host_id) for h in hosts])
            for host, claim in zip(hosts, claims, strict=True):
                if claim is not None:
                    view.claims[host.host_id] = Claim.model_validate_json(claim)
        names = sorted({*models, *(h.model for h in hosts if h.model)})
        if names:
            failures = await self.redis.mget([keys.model_failure(n) for n in names])
            for name, failure in zip(names, failures, strict=True):
                if failure is not None:
                    view.failures[name] = ModelFailure.model_validate_json(failure)
        for name in names:
            workers = await self.registry.live_workers(name)
            if fleet_sleeping(workers):
                view.sleeping.add(name)
            pinned = [w for w in workers if w.worker_id not in host_ids]
            if pinned:
                view.pinned[name] = pinned
            serving = [w for w in workers if w.worker_id in host_ids]
            loads = await self.registry.loads(serving)
            queued = await self.redis.zcard(keys.slot_queue(name)) if serving else 0
            for worker in serving:
                view.idle[worker.worker_id] = loads.get(worker.worker_id, 0.0) == 0 \
                    and not queued
        return view

    async def last_used(self) -> dict[str, float]:
        pairs = await self.redis.zrange(keys.MODELS_LAST_USED, 0, -1, withscores=True)
        return {_text(name): float(score) for name, score in pairs}

    async def wait_in_line(self, model: str, max_wait_s: float) -> bool:
        """`model` waits to be loaded (its first waiter's time is kept); whether it is first
        in line (loads are placed first in, first out). Waits older than `max_wait_s` leave."""
        now = time.time()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(keys.MODELS_WAITING, "-inf", now - max_wait_s)
            pipe.zadd(keys.MODELS_WAITING, {model: now}, nx=True)
            pipe.zrange(keys.MODELS_WAITING, 0, 0)
            first = (await pipe.execute())[-1]
        return bool(first) and _text(first[0]) == model

    async def leave_line(self, model: str) -> None:
        await self.redis.zrem(keys.MODELS_WAITING, model)

    async def freeing(self) -> bool:
        """Whether some worker is unloading (it will be free once drained)."""
        view = await self.view([])
        return any(h.state is HostState.UNLOADING for h in view.host_views())

    async def touch(self, model: str) -> None:
        """A POST request named the model: it is the most recently used now."""
        await self.redis.zadd(keys.MODELS_LAST_USED, {model: time.time()})

    # -- placing ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lock(self) -> AsyncIterator[None]:
        token = secrets.token_hex(8)
        deadline = time.monotonic() + LOCK_WAIT_S
        while not await self.redis.set(keys.PLACEMENT_LOCK, token, nx=True,
                                       px=keys.PLACEMENT_LOCK_MS):
            if time.monotonic() > deadline:
                raise Unavailable("another placement is under way; retry later", retry_after_s=1)
            await asyncio.sleep(0.02)
        try:
            yield
        finally:
            await self.redis.eval(_RELEASE, 1, keys.PLACEMENT_LOCK, token)  # type: ignore[misc]

    async def place(self, entry: ModelEntry, models_max: int, all_models: list[str]) -> LoadPlan:
        """Decide where `entry` loads (scheduler/placement.py) and send the commands; raises
        AlreadyRunning / NoCapacity from the placement rule."""
        async with self._lock():
            view = await self.view(all_models)
            placement = Placement(view.host_views(), await self.last_used(), models_max,
                                  frozenset(view.pinned))
            plan = placement.plan_load(entry.name)
            for host_id in plan.unload:
                await self._command(host_id, HostCommand(op="unload"), Claim(model=None))
            await self.redis.delete(keys.model_failure(entry.name))
            await self._command(plan.host_id, HostCommand(op="load", entry=entry),
                                Claim(model=entry.name))
        for victim in plan.victims:
            log.info("--models-max %d reached: unloading %s (least recently used)", models_max,
                     victim)
        log.info("model %s: loading on worker %s", entry.name, plan.host_id)
        await self.publish(status_event(entry.name, "loading"))
        return plan

    async def unload(self, model: str) -> list[str]:
        """Tell every host serving `model` to unload it; the hosts that were told."""
        async with self._lock():
            view = await self.view([model])
            hosts = Placement(view.host_views()).plan_unload(model)
            for host_id in hosts:
                await self._command(host_id, HostCommand(op="unload"), Claim(model=None))
        return hosts

    async def _command(self, host_id: str, command: HostCommand, claim: Claim) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.host_claim(host_id), claim.model_dump_json(),
                     ex=keys.HOST_CLAIM_TTL_S)
            pipe.rpush(keys.host_commands(host_id), command.model_dump_json())
            pipe.expire(keys.host_commands(host_id), keys.HOST_CLAIM_TTL_S * 10)
            await pipe.execute()

    # -- events -------------------------------------------------------------------------

    async def publish(self, event: dict[str, Any]) -> None:
        await self.redis.publish(keys.MODELS_CHANNEL, json.dumps(event, separators=(",", ":")))

    async def record_failure(self, model: str, failure: ModelFailure) -> None:
        await self.redis.set(keys.model_failure(model), failure.model_dump_json())


def status_event(model: str, status: str, **data: Any) -> dict[str, Any]:
    """A `/models/sse` model_status event."""
    return {"model": model, "event": "model_status", "data": {"status": status, **data}}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
