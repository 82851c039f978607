"""The one way a route is registered. Each endpoint family (api/endpoints/<family>/api_router.py)
makes `routes = Routes("family")` and decorates its handlers:

    @routes.post("/v1/embeddings", "/embeddings", body=EmbeddingsRequest)
    async def embeddings(request: Request) -> HTTPResponse: ...

Several paths are llama-server's aliases of one handler. `body` names the wire model of the
body, which /openapi.json describes (api/endpoints/openapi/api_router.py reads it back from the
route). The app registers every family's blueprint (api/endpoints/__init__.py) under
--api-prefix."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel
from sanic import Blueprint, Request
from sanic.response import HTTPResponse
from sanic.router import Route

Handler = TypeVar("Handler", bound=Callable[..., Coroutine[Any, Any, HTTPResponse | None]])


class Routes:
    def __init__(self, name: str, **options: Any) -> None:
        self.blueprint = Blueprint(name, **options)

    def route(self, methods: list[str], *paths: str, name: str | None = None,
              body: type[BaseModel] | None = None, guarded: bool = False,
              admin: str | None = None, **options: Any) -> Callable[[Handler], Handler]:
        """Register the handler under each of `paths`. A route's name is `name` (default: the
        handler's); a handler with several paths gets one name per path. `guarded`: a route
        that changes the fleet or runs things on the pod, which a browser may call only from
        the pod's own origin or a listed one (api/origin_guard.py). `admin` (what the route
        does, for the error): under --tenants only the admin tenant may call it (403
        `permission_error`, api/tenants/service.py `require_admin`). The error format is
        named (JSON, what api/errors.py answers every exception with; Sanic's own error page,
        the only reader of it, never renders ours): unnamed, Sanic guesses it from the
        handler's source (inspect and ast), 0.1 s of CPU at every pod start."""

        def register(handler: Handler) -> Handler:
            base = name or handler.__name__
            served = handler if admin is None else _admin_only(handler, admin)
            for path in paths:
                route_name = base if len(paths) == 1 else f"{base}{_slug(path)}"
                self.blueprint.add_route(served, path, methods=methods, name=route_name,
                                         ctx_body=body, ctx_guarded=guarded,
                                         ctx_admin=admin is not None,
                                         **{"error_format": "json", **options})
            return handler

        return register

    def get(self, *paths: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.route(["GET"], *paths, **options)

    def post(self, *paths: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.route(["POST"], *paths, **options)

    def delete(self, *paths: str, **options: Any) -> Callable[[Handler], Handler]:
        return self.route(["DELETE"], *paths, **options)


def _admin_only(handler: Handler, what: str) -> Handler:
    @functools.wraps(handler)
    async def checked(request: Request, *args: Any, **kwargs: Any) -> HTTPResponse | None:
        request.ctx.tenant.require_admin(what)
        return await handler(request, *args, **kwargs)

    return checked  # type: ignore[return-value]


def body_model(route: Route) -> type[BaseModel] | None:
    """The wire model a route was registered with (None: any JSON object)."""
    model: type[BaseModel] | None = getattr(route.ctx, "body", None)
    return model


def is_guarded(route: Route | None) -> bool:
    """Whether the route was registered with `guarded=True`."""
    return route is not None and bool(getattr(route.ctx, "guarded", False))


def _slug(path: str) -> str:
    return path.replace("/", "_").replace(".", "_").replace("-", "_")
