"""What runs around every request of an api pod, in order: refusal while draining, CORS
preflight, a browser's request from another site to a guarded route (api/origin_guard.py), the
API key (a tenant's key and request limits under --tenants), router mode's
model; on the way out, CORS's allowed origin."""

from __future__ import annotations

from sanic import Request, Sanic
from sanic.response import HTTPResponse

from api.auth import is_public, request_tenant
from api.cors import add_allow_origin, preflight
from api.endpoints.ui.api_router import is_ui_route
from api.errors import error_response
from api.origin_guard import refusal
from api.routing import is_guarded
from api.services import services
from api.tenants.config import UNLIMITED
from api.tenants.service import CURRENT
from scheduler.contract.errors import (
    AuthenticationFailed,
    LlamaqError,
    PermissionDenied,
    Unavailable,
)


async def authenticate(request: Request) -> HTTPResponse | None:
    pod = services(request)
    settings = pod.settings
    if pod.draining:
        return error_response(Unavailable("the server is shutting down", retry_after_s=1))
    if preflight_response := preflight(request, settings):
        return preflight_response
    if is_guarded(request.route) and \
            (reason := refusal(request.headers, settings)) is not None:
        return error_response(PermissionDenied(reason))
    if is_ui_route(request, settings.ui):  # the web UI's pages and assets
        request.ctx.tenant = pod.tenants.scope(UNLIMITED)
        return None
    tenant = request_tenant(request, pod.directory, settings.api_prefix)
    if tenant is None:
        return error_response(AuthenticationFailed("Invalid API Key"))
    scope = pod.tenants.scope(tenant)
    request.ctx.tenant = scope
    if pod.directory.enabled:  # this request's task: the job client meters and limits it
        CURRENT.set(scope)
    if pod.directory.enabled and request.method != "OPTIONS" \
            and not is_public(request.path, settings.api_prefix):
        try:
            await scope.take_request()
        except LlamaqError as error:
            return error_response(error)
    return None


async def route_by_model(request: Request) -> None:
    """Router mode: the model a request names (body `model`, or `?model=`), checked and
    loaded on demand; handlers read it with api.services.request_model."""
    pod = services(request)
    router = pod.router
    if router is not None and request.method != "OPTIONS" \
            and not is_ui_route(request, pod.settings.ui):
        request.ctx.model_id = await router.route(request)


async def cors(request: Request, response: HTTPResponse) -> None:
    add_allow_origin(request, response, services(request).settings)


def add_middleware(app: Sanic) -> None:
    app.on_request(authenticate)
    app.on_request(route_by_model)
    app.on_response(cors)
