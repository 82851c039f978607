"""Endpoints of llama-server whose features this fleet does not have yet, answered the way
llama-server answers when the feature is off: 501 with a message, never a 404 or a 500.
(Embeddings and rerank: api/endpoints/embeddings/api_router.py.)"""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body, load_json, raw_body
from api.routing import Routes
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest, NotSupported

routes = Routes("extras")


@routes.get("/lora-adapters")
async def lora_adapters(request: Request) -> HTTPResponse:
    """No LoRA adapter is loaded (workers refuse --lora for now): the list is empty."""
    return json([])


@routes.post("/lora-adapters")
async def set_lora_adapters(request: Request) -> HTTPResponse:
    body = json_body_list(request)
    if body:
        raise InvalidRequest("invalid adapter id: no LoRA adapter is loaded")
    return json({"success": True})


@routes.post("/props")
async def set_props(request: Request) -> HTTPResponse:
    settings: ApiSettings = request.app.ctx.settings
    if not settings.props:
        raise NotSupported("This server does not support changing global properties. "
                           "Start it with `--props`")
    json_body(request)
    return json({"success": True})


def json_body_list(request: Request) -> list[object]:
    raw = raw_body(request)
    body = load_json(raw) if raw.strip() else None
    if not isinstance(body, list):
        raise InvalidRequest("Request body must be an array")
    return body
