"""Router mode's model endpoints: `GET /models` (and `/v1/models`), `POST /models/load`,
`POST /models/unload`, `GET /models/sse` (the spec's "Using multiple models")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body
from api.endpoints.native.render import model_card
from api.router import RUNNING, ModelRouter
from api.routing import Routes
from api.services import services
from api.sse import open_stream
from scheduler.contract.errors import InvalidRequest, NotFound, ServerError, Unavailable
from scheduler.downloads import DownloadBoard, incomplete_sidecars
from scheduler.fleet_models import status_of
from scheduler.placement import AlreadyRunning, NoCapacity

log = logging.getLogger(__name__)
routes = Routes("models_api")
SSE_KEEPALIVE_S = 15.0


def _router(request: Request) -> ModelRouter:
    router = services(request).router
    if router is None:  # as llama-server: these routes exist in router mode only
        raise NotFound("File Not Found")
    return router


def _model_name(request: Request) -> str:
    name = json_body(request).get("model", "")
    return name if isinstance(name, str) else ""


async def router_models(request: Request) -> HTTPResponse:
    """Every model of the catalog, with its status (`?reload=1` reads the sources again)."""
    router = _router(request)
    if request.args.get("reload"):
        await router.reload()
    elif router.stale:  # a download finished or a model was deleted somewhere
        await router.reload(announce=False)
    view = await router.view()
    created = int(services(request).started_at)
    data: list[dict[str, Any]] = []
    for entry in router.catalog.visible():
        status = status_of(entry.name, entry, view)
        item: dict[str, Any] = {
            "id": entry.name,
            "aliases": entry.aliases,
            "tags": entry.tags,
            "object": "model",
            "owned_by": "llamacpp",
            "created": created,
            "status": status.to_wire(),
            "architecture": entry.architecture.model_dump(),
            "source": entry.source,
            "can_remove": entry.source in ("cache", "store"),
        }
        if entry.model:
            item["path"] = entry.model
        if entry.sidecars:
            item["sidecars"] = entry.sidecars
        if missing := incomplete_sidecars(view.download_status.get(entry.name),
                                          tuple(entry.sidecars)):
            item["incomplete_sidecars"] = missing
        if status.value in RUNNING:  # the loaded instance's /v1/models info, added
            workers = await router.models.registry.live_workers(entry.name)
            if workers:
                card = model_card(entry.name, created, workers[0].meta, workers[0].n_ctx_slot)
                item.update({k: v for k, v in card.items() if k not in item})
        data.append(item)
    for name, download in view.download_status.items():  # not in any source yet
        if router.catalog.find(name) is None:
            data.append({"id": name, "aliases": [], "tags": [], "object": "model",
                         "owned_by": "llamacpp", "created": created,
                         "status": download.to_wire(), "source": "cache", "can_remove": True,
                         "architecture": {"input_modalities": ["text"],
                                          "output_modalities": ["text"]}})
    for name, workers in view.pinned.items():  # workers started with -m: always loaded
        if router.catalog.find(name) is None:
            card = model_card(name, created, workers[0].meta, workers[0].n_ctx_slot)
            data.append({**card, "status": {"value": "loaded",
                                            "args": ["llamaq", "worker", "-m", name]}})
    return json({"data": data, "object": "list"})


@routes.post("/models/load", name="models_load", guarded=True, admin="loading a model")
async def load(request: Request) -> HTTPResponse:
    router = _router(request)
    entry = router.entry(_model_name(request))
    if entry is None:
        raise NotFound("model is not found")
    if (await router.status(entry.name)).value in RUNNING:
        raise InvalidRequest("model is already running")
    try:
        await router.place(entry)
    except AlreadyRunning:
        raise InvalidRequest("model is already running") from None
    except NoCapacity as exc:
        if not await router.models.hosts():  # no worker can ever load it: a setup to fix
            raise Unavailable(f"cannot load model '{entry.name}' now: {exc}",
                              retry_after_s=5) from None
        log.info("model %s: no room to load it (%s)", entry.name, exc)
        raise ServerError("model limit reached, try again later") from None  # llama-server's
    return json({"success": True})


@routes.post("/models/unload", name="models_unload", guarded=True, admin="unloading a model")
async def unload(request: Request) -> HTTPResponse:
    router = _router(request)
    name = _model_name(request)
    if name and await DownloadBoard(router.models.redis).request_stop(name):
        return json({"success": True})  # a download pauses (listed as incomplete)
    entry = router.entry(name)
    if entry is None:
        raise InvalidRequest("model is not found")
    view = await router.models.view([entry.name])
    if status_of(entry.name, entry, view).value not in RUNNING:
        raise InvalidRequest("model is not running")
    if not await router.models.unload(entry.name):
        raise InvalidRequest(f"model '{entry.name}' is served by workers started with -m; "
                             "it cannot be unloaded")
    return json({"success": True})


@routes.get("/models/sse", name="models_sse")
async def sse(request: Request) -> None:
    """Each model event of the fleet, as `data: {json}`, from whichever process saw it."""
    router = _router(request)
    async with router.listen() as events:
        response = await open_stream(request)
        while True:
            try:
                event = await asyncio.wait_for(events.get(), SSE_KEEPALIVE_S)
            except TimeoutError:
                await response.send(": keep-alive\n\n")
                continue
            except asyncio.CancelledError:
                break
            await response.send(f"data: {event}\n\n")
    with contextlib.suppress(Exception):
        await response.eof()
