"""Endpoints of llama-server whose features this fleet does not have yet, answered the way
llama-server answers when the feature is off: 501 with a message, never a 404 or a 500.
(Embeddings and rerank: api/endpoints/embeddings/api_router.py.)"""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body
from api.routing import Routes
from api.services import services
from scheduler.contract.errors import NotSupported

routes = Routes("extras")


@routes.post("/props", guarded=True)
async def set_props(request: Request) -> HTTPResponse:
    settings = services(request).settings
    if not settings.props:
        raise NotSupported("This server does not support changing global properties. "
                           "Start it with `--props`")
    json_body(request)
    return json({"success": True})

