"""The Sanic app factory of an api pod."""

from __future__ import annotations

import logging
import os
import time

from sanic import Request, Sanic
from sanic.response import HTTPResponse

from api.auth import check_api_key, load_api_keys
from api.chat.templates import validate_chat_template_setting
from api.cors import add_allow_origin, preflight
from api.errors import install_error_handler
from api.fleet import Fleet
from api.openapi import openapi
from api.routes.anthropic import anthropic
from api.routes.extras import extras
from api.routes.monitor import monitor
from api.routes.native import native
from api.routes.openai import openai
from api.routes.predict import VertexSettings, add_predict_route
from api.routes.templates import templates
from api.settings import ApiSettings
from scheduler.limits import largest_body_limit

log = logging.getLogger(__name__)


def create_app(settings: ApiSettings, redis_url: str, name: str = "llamaq") -> Sanic:
    validate_chat_template_setting(settings)  # an unknown --chat-template stops the start
    app = Sanic(name)
    app.config.REQUEST_TIMEOUT = settings.timeout
    app.config.RESPONSE_TIMEOUT = settings.timeout
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.NOISY_EXCEPTIONS = False
    app.config.REQUEST_MAX_SIZE = largest_body_limit()  # each route has its own, below it
    app.ctx.settings = settings
    app.ctx.started_at = time.time()
    api_keys = load_api_keys(settings.api_key, settings.api_key_file)

    @app.before_server_start
    async def connect(app: Sanic) -> None:
        app.ctx.fleet = await Fleet.connect(redis_url, float(settings.timeout),
                                            settings.n_probs_max)

    @app.after_server_stop
    async def disconnect(app: Sanic) -> None:
        await app.ctx.fleet.close()

    @app.on_request
    async def authenticate(request: Request) -> HTTPResponse | None:
        return preflight(request, settings) or check_api_key(request, api_keys)

    @app.on_response
    async def cors(request: Request, response: HTTPResponse) -> None:
        add_allow_origin(request, response, settings)

    for blueprint in (native, monitor, openai, templates, anthropic, extras, openapi):
        app.blueprint(blueprint, url_prefix=settings.api_prefix or None)
    vertex = VertexSettings.from_env(os.environ)
    if vertex.enabled:
        add_predict_route(app, vertex, settings.api_prefix)
    install_error_handler(app)
    return app
