"""The OpenAPI document of the HTTP API, generated from the app's routes and the wire model each
was registered with (api/routing.py `body=`; pydantic's JSON schema), served at /openapi.json.
Nothing in it is written by hand: a route without a wire model takes any JSON object (its
handler checks it)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from sanic import Request, Sanic
from sanic.response import HTTPResponse, json

from api.routing import Routes, body_model
from api.services import services
from scheduler.contract.deferred import DeferredModel

routes = Routes("openapi")
PATH_PARAM = re.compile(r"<([^:>]+)(?::[^>]*)?>")


class ErrorInfoWire(DeferredModel):
    code: int
    message: str
    type: str


class ErrorResponse(DeferredModel):
    """Every error, in the spec's format."""

    error: ErrorInfoWire


def openapi_document(app: Sanic) -> dict[str, Any]:
    bodies = {body_model(route) for route in app.router.routes}
    models: list[type[BaseModel]] = sorted({*(m for m in bodies if m), ErrorResponse},
                                           key=lambda m: m.__name__)
    refs, defs = models_json_schema([(m, "validation") for m in models],
                                    ref_template="#/components/schemas/{model}")
    error = {"description": "an error in the spec's format",
             "content": {"application/json": {"schema": refs[(ErrorResponse, "validation")]}}}
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes:
        path = "/" + route.path.strip("/")
        if path == "/openapi.json":
            continue
        params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in PATH_PARAM.findall(path)]
        path = PATH_PARAM.sub(r"{\1}", path)
        for method in sorted(route.methods):
            if method in ("OPTIONS", "HEAD"):
                continue
            operation: dict[str, Any] = {
                "operationId": f"{method.lower()}_{route.name.split('.')[-1]}",
                "responses": {"200": {"description": "the spec's answer"}, "default": error},
            }
            if params:
                operation["parameters"] = params
            if method == "POST":
                model = body_model(route)
                schema = refs[(model, "validation")] if model else {"type": "object"}
                operation["requestBody"] = {"required": True,
                                            "content": {"application/json": {"schema": schema}}}
            paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "llamaq: the llama.cpp HTTP server API, served by a fleet",
                 "version": "1"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": defs.get("$defs", {})},
    }


@routes.get("/openapi.json", name="openapi")
async def openapi_json(request: Request) -> HTTPResponse:
    pod = services(request)
    if pod.openapi is None:
        pod.openapi = openapi_document(request.app)
    return json(pod.openapi)
