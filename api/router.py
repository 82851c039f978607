"""Router mode on an api pod: the model catalog, which model a request is for, loading it on
demand, and the relay of `/models/sse` events from Redis to this pod's clients.

llama-server's router checks each routed request the same way (server-models.cpp,
`router_validate_model`): no model named -> 400 "model name is missing from the request";
unknown -> 400 "model 'X' not found"; not running and autoload off -> 400 "model is not
loaded". With autoload (--models-autoload, or `?autoload=true|false` per request), a model
that is not running is placed on a worker (scheduler/placement.py) and the request waits for
it; a load that fails ends the request with 500 "model name=X failed to load".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sanic import Request

from api.body import parsed_json, raw_body
from api.settings import ApiSettings
from scheduler.catalog import Catalog, CatalogError, CatalogSources, ModelEntry, load_catalog
from scheduler.contract import keys
from scheduler.contract.errors import InvalidRequest, ServerError, Unavailable
from scheduler.fleet_models import FleetModels, FleetView, ModelStatus, status_of
from scheduler.placement import AlreadyRunning, NoCapacity
from storage import open_store
from storage.hf import hub_cache_dir
from storage.redact import redact

log = logging.getLogger(__name__)

READY_POLL_S = 0.2
RELAY_RETRY_S = 1.0
RELAY_POLL_S = 1.0
STARTUP_LOAD_S = 60.0
RUNNING = ("loading", "loaded", "sleeping")
ROUTED_GET = ("/metrics", "/slots", "/lora-adapters")
NOT_ROUTED_POST = ("/models", "/models/load", "/models/unload", "/v1/chat/completions/control",
                   "/tools", "/cors-proxy", "/v1/streams/lookup")
ARG_ROUTED_POST = ("/lora-adapters",)
"""POSTs whose body is not an object (an array): their model is `?model=`."""
NOT_ROUTED_PREFIXES = ("/v1/files", "/v1/batches")
"""The Files and Batch API: not routed by a `model` (api/endpoints/files/api_router.py refuses
it on a router)."""


def catalog_sources(settings: ApiSettings) -> CatalogSources:
    """The sources of the spec: the Hub cache of this machine (under LLAMA_CACHE, which wins
    over --cache-dir), the object store, --models-dir, --models-preset."""
    return CatalogSources(
        models_dir=Path(settings.models_dir) if settings.models_dir else None,
        models_preset=Path(settings.models_preset) if settings.models_preset else None,
        cache_dir=hub_cache_dir(settings.model_cache_dir()),
        store=open_store(settings.store_url, settings.s3_endpoint_url),
    )


class ModelRouter:
    """One per api pod in router mode."""

    def __init__(self, settings: ApiSettings, redis: Redis, catalog: Catalog) -> None:
        self.settings = settings
        self.models = FleetModels(redis)
        self.catalog = catalog
        self._listeners: set[asyncio.Queue[str]] = set()
        self._preset_settings: dict[tuple[str, tuple[tuple[str, str], ...]], ApiSettings] = {}
        self.stale = False
        """A download finished or a model was deleted: the next listing reads the sources
        again (the spec: "call GET /models to trigger model list update")."""

    @classmethod
    async def create(cls, settings: ApiSettings, redis: Redis) -> ModelRouter:
        catalog = await asyncio.to_thread(load_catalog, catalog_sources(settings))
        log.info("router mode: %d models known", len(catalog.entries))
        return cls(settings, redis, catalog)

    # -- the catalog ----------------------------------------------------------------------

    async def reload(self, announce: bool = True) -> None:
        """Read the sources again (`GET /models?reload=1`, or another pod's reload): a running
        model that changed or left its source unloads."""
        self.stale = False
        old = self.catalog
        try:
            self.catalog = await asyncio.to_thread(load_catalog,
                                                   catalog_sources(self.settings))
        except CatalogError as exc:  # the old list stays
            log.error("cannot reload the models: %s", exc)
            raise ServerError(f"cannot read the model sources: {redact(str(exc))}") from None
        if not announce:
            return
        for name, entry in old.entries.items():
            new = self.catalog.entries.get(name)
            if new is not None and _same_load(new, entry):
                continue
            if await self.models.unload(name):
                log.info("model %s changed or left its source: unloading it", name)
            if new is None:
                await self.models.publish({"model": name, "event": "model_remove"})
        await self.models.publish({"model": "*", "event": "models_reload"})

    def entry(self, name: str) -> ModelEntry | None:
        return self.catalog.find(name)

    def settings_for(self, name: str) -> ApiSettings:
        """This pod's settings for one model: its preset's api options applied (`chat-template`,
        `jinja`, `reasoning-format` ...) where the pod's own command line left them unset."""
        entry = self.entry(name)
        if entry is None or not entry.options:
            return self.settings
        key = (entry.name, tuple(entry.options.items()))
        if key not in self._preset_settings:
            try:
                self._preset_settings[key] = self.settings.with_preset(entry.options)
            except ValueError as exc:  # checked at start; a reloaded preset may still be bad
                raise ServerError(f"model {entry.name}: {exc}") from None
        return self._preset_settings[key]

    async def view(self) -> FleetView:
        return await self.models.view(list(self.catalog.entries))

    async def status(self, name: str) -> ModelStatus:
        return status_of(name, self.catalog.entries.get(name), await self.models.view([name]))

    # -- routing a request ----------------------------------------------------------------

    async def route(self, request: Request) -> str | None:
        """The model a request is for (None: the route is not routed by model)."""
        path = request.path.removeprefix(self.settings.api_prefix) or "/"
        if request.method == "POST":
            if (path in NOT_ROUTED_POST or path.startswith(NOT_ROUTED_PREFIXES)
                    or request.route is None):
                return None
            raw = raw_body(request)
            body = parsed_json(request, raw, keep=True)
            name = body.get("model") if isinstance(body, dict) else None
            if path in ARG_ROUTED_POST:
                name = request.args.get("model")
            post = True
        elif request.method == "GET" and (path in ROUTED_GET
                                          or (path == "/props" and "model" in request.args)):
            name, post = request.args.get("model"), False
        else:
            return None
        return await self.validate(str(name) if isinstance(name, str) else "",
                                   self.autoload(request), post)

    def autoload(self, request: Request) -> bool:
        asked = request.args.get("autoload")
        if asked is None:
            return self.settings.models_autoload
        return asked in ("true", "1")

    async def validate(self, name: str, autoload: bool, post: bool) -> str:
        if not name:
            raise InvalidRequest("model name is missing from the request")
        entry = self.entry(name)
        if entry is None:
            if not await self.models.registry.live_workers(name):  # a worker's -m model
                raise InvalidRequest(f"model '{name}' not found")
            return name
        name = entry.name  # an alias names its model
        if not await self.models.registry.live_workers(name) and not await self._cold(name):
            status = await self.status(name)
            if status.value not in RUNNING and not autoload:
                raise InvalidRequest("model is not loaded")
            if autoload and status.value not in ("loaded", "sleeping"):
                await self.ensure_ready(entry)
        if post:
            await self.models.touch(name)
        return name

    async def _cold(self, name: str) -> bool:
        """Ours (api/cold_start.py): with --cold-start-timeout and no worker that could load
        models (every worker is one model's own, started with -m: a Kubernetes Deployment
        per model scaled to zero), a model no worker serves yet is held for its worker
        instead of refused."""
        if self.settings.cold_start_timeout <= 0 or await self.models.hosts():
            return False
        log.debug("model %s: no worker serves it yet; its requests wait for one", name)
        return True

    async def ensure_ready(self, entry: ModelEntry) -> None:
        """Load `entry` if nothing runs it, and wait until a worker serves it."""
        deadline = time.monotonic() + self.settings.timeout
        placed = False
        try:
            while time.monotonic() < deadline:
                if await self.models.registry.live_workers(entry.name):
                    return
                status = await self.status(entry.name)
                if status.value == "loading":  # placed by someone else: its outcome is ours
                    placed = True
                elif status.value == "unloaded":
                    if placed and status.failed:
                        raise ServerError(f"model name={entry.name} failed to load")
                    first = await self.models.wait_in_line(entry.name, self.settings.timeout)
                    if first:  # loads are placed first in, first out
                        placed = await self._place_or_wait(entry)
                await asyncio.sleep(READY_POLL_S)
        finally:
            with contextlib.suppress(RedisError):
                await self.models.leave_line(entry.name)
        raise Unavailable(f"model '{entry.name}' did not load in time", retry_after_s=5)

    async def _place_or_wait(self, entry: ModelEntry) -> bool:
        """Place `entry`; False while a worker that is unloading will make room. With no room
        coming (every model serving, or no worker at all) it ends the wait as llama-server
        does."""
        try:
            await self.place(entry)
            return True
        except AlreadyRunning:
            return True
        except NoCapacity as exc:
            if not await self.models.hosts():
                raise Unavailable("no worker can load a model: every worker was started with "
                                  "-m (start workers without -m)", retry_after_s=5) from None
            if not await self.models.freeing():  # a model that is serving is never evicted
                log.info("model %s: no room to load it (%s)", entry.name, exc)
                raise ServerError("model limit reached, try again later") from None
            log.debug("model %s waits for a worker being freed: %s", entry.name, exc)
            return False

    async def place(self, entry: ModelEntry) -> None:
        await self.models.place(entry, self.settings.models_max, list(self.catalog.entries))

    async def load_on_startup(self) -> None:
        """Preset models with `load-on-startup`: placed once workers are there (any pod may
        do it; the second finds them running)."""
        wanted = [e for e in self.catalog.entries.values() if e.load_on_startup]
        deadline = time.monotonic() + STARTUP_LOAD_S
        while wanted and time.monotonic() < deadline:
            for entry in list(wanted):
                try:
                    await self.place(entry)
                except AlreadyRunning:
                    pass
                except (NoCapacity, Unavailable, RedisError):
                    continue
                wanted.remove(entry)
            await asyncio.sleep(1.0)
        for entry in wanted:
            log.warning("model %s: load-on-startup: no worker took it", entry.name)

    # -- events ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def listen(self) -> AsyncIterator[asyncio.Queue[str]]:
        """The events published from now on (each one JSON), for one SSE client."""
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1000)
        self._listeners.add(queue)
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    async def relay(self, redis: Redis) -> None:
        """Every model event published by any process (keys.MODELS_CHANNEL), to this pod's
        SSE clients; another pod's models_reload reloads this pod's catalog too."""
        while True:
            pubsub = redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.MODELS_CHANNEL)
                while True:  # polled: the client's reply timeout is not an idle channel's
                    message = await pubsub.get_message(timeout=RELAY_POLL_S)
                    if message is not None and message.get("type") == "message":
                        await self._deliver(message["data"])
            except RedisError as error:
                log.warning("model events: lost Redis (%s); resubscribing", error)
                await asyncio.sleep(RELAY_RETRY_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _deliver(self, data: bytes | str) -> None:
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        try:
            event: Any = json.loads(text)
        except ValueError:
            log.warning("model events: junk message %r", text[:100])
            return
        kind = event.get("event") if isinstance(event, dict) else None
        if kind == "models_reload":
            with contextlib.suppress(Exception):
                await self.reload(announce=False)
        elif kind in ("download_finished", "model_remove"):
            self.stale = True
        for queue in list(self._listeners):
            with contextlib.suppress(asyncio.QueueFull):  # a stuck client loses events
                queue.put_nowait(text)


def _same_load(a: ModelEntry, b: ModelEntry) -> bool:
    fields = ("model", "hf_repo", "hf_file", "options", "mmproj")
    return all(getattr(a, f) == getattr(b, f) for f in fields)

