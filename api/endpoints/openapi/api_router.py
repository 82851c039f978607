"""The OpenAPI document of the HTTP API, generated from the app's routes and the wire models
(pydantic's JSON schema), served at /openapi.json. Nothing in it is written by hand: a route
without a wire model takes any JSON object (its handler checks it)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from sanic import Blueprint, Request, Sanic
from sanic.response import HTTPResponse, json

from api.endpoints.anthropic.protocol import MessagesRequest
from api.endpoints.models.downloads import DownloadRequest
from api.endpoints.native.protocol import (
    CompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    TokenizeRequest,
)
from api.endpoints.openai.chat import ControlRequest
from api.endpoints.openai.protocol import ChatCompletionRequest, OpenAICompletionRequest
from api.endpoints.systemone.protocol import SystemOneRequest
from api.endpoints.templates.api_router import ApplyTemplateRequest

openapi = Blueprint("openapi")
PATH_PARAM = re.compile(r"<([^:>]+)(?::[^>]*)?>")


class ErrorInfoWire(BaseModel):
    code: int
    message: str
    type: str


class ErrorResponse(BaseModel):
    """Every error, in the spec's format."""

    error: ErrorInfoWire


REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/completion": CompletionRequest,
    "/completions": CompletionRequest,
    "/infill": InfillRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/apply-template": ApplyTemplateRequest,
    "/v1/completions": OpenAICompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/chat/completions": ChatCompletionRequest,
    "/v1/chat/completions/input_tokens": ChatCompletionRequest,
    "/chat/completions/input_tokens": ChatCompletionRequest,
    "/v1/chat/completions/control": ControlRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": MessagesRequest,
    "/v1/systemone": SystemOneRequest,
    "/models": DownloadRequest,
}
"""The wire model of each POST route's body (routes not listed take any JSON object)."""


def openapi_document(app: Sanic, prefix: str = "") -> dict[str, Any]:
    models: list[type[BaseModel]] = sorted({*REQUEST_MODELS.values(), ErrorResponse},
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
        route_path = path[len(prefix):] if prefix and path.startswith(prefix) else path
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
                model = REQUEST_MODELS.get(route_path)
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


@openapi.get("/openapi.json", name="openapi")
async def openapi_json(request: Request) -> HTTPResponse:
    app = request.app
    if not hasattr(app.ctx, "openapi"):
        app.ctx.openapi = openapi_document(app, app.ctx.settings.api_prefix)
    return json(app.ctx.openapi)
