"""What an api pod's handlers use, in one typed object: its settings, its connections to the
fleet, its tenants, its store, its router (router mode) and its server tools. `create_app`
(api/app/) makes it and puts it on the app once; the start listener (api/app/lifecycle.py)
connects it before the first request. Handlers read it with `services(request)`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sanic import Request, Sanic

from api.auth import request_tenant
from api.body import FrozenBodies
from api.fleet import Fleet
from api.model_downloads import PodDownloads
from api.router import ModelRouter
from api.settings import ApiSettings
from api.tenants.service import TenantDirectory, TenantService
from api.tools.service import ToolsService
from storage import ObjectStore


@dataclass
class PodServices:
    settings: ApiSettings
    directory: TenantDirectory
    """The --tenants file's tenants and their keys (or the API keys, one tenant)."""
    api_keys: frozenset[str]
    """The keys a request may present (`(tenants)` when the --tenants file names them); empty:
    no key is asked for."""
    ui_settings: dict[str, Any]
    """The web UI's defaults (`ui_settings` in /props)."""
    store: ObjectStore
    """The fleet's object store, opened on first use."""
    downloads: PodDownloads
    started_at: float = field(default_factory=time.time)
    draining: bool = False
    """A signal came: new requests are refused (503) while the open ones end."""
    frozen_bodies: FrozenBodies = field(default_factory=FrozenBodies)
    """Big bodies parsed off the event loop (api/sanic_app.py)."""
    fleet: Fleet = field(init=False)
    """Redis, the arq pool, the event hub and the job client (connected at start)."""
    tenants: TenantService = field(init=False)
    """The tenants and their fleet-wide limits (at start, on the fleet's Redis)."""
    router: ModelRouter | None = None
    """Router mode's model router (at start), None with a model."""
    tools: ToolsService | None = None
    """The server tools (at start), None when /tools is off."""
    openapi: dict[str, Any] | None = None
    """The /openapi.json document, made at its first request."""
    offline_modalities: dict[tuple[str, int, int], list[str]] = field(default_factory=dict)
    """Model files' output modalities by (path, mtime, size), read once per file version
    (api/endpoints/native/api_router.py)."""

    def refuses_key(self, request: Request) -> bool:
        """The request presents no key that names a tenant (401 before its body is read)."""
        return request_tenant(request, self.directory, self.settings.api_prefix) is None


def pod_services(app: Sanic) -> PodServices:
    found: PodServices = app.ctx.services
    return found


def services(request: Request) -> PodServices:
    """The services of the pod that serves `request`."""
    return pod_services(request.app)


def request_settings(request: Request) -> ApiSettings:
    """The settings a request is served with: the pod's, and in router mode its model's preset
    options over them."""
    pod = services(request)
    routed: str | None = getattr(request.ctx, "model_id", None)
    return pod.router.settings_for(routed) if pod.router is not None and routed else pod.settings


def request_model(request: Request) -> str:
    """The model a request is served by: in router mode the one it named (set by the routing
    middleware), else the pod's model."""
    routed: str | None = getattr(request.ctx, "model_id", None)
    if routed:
        return routed
    return services(request).settings.model_id()
