"""An api pod's routes: every endpoint family's under --api-prefix (api/endpoints/families.py),
the web UI's, Vertex AI's predict route when its environment asks for it, and the error
handler that answers in the spec's format."""

from __future__ import annotations

import os

from sanic import Blueprint, Sanic

from api.endpoints.families import FAMILIES
from api.endpoints.vertex.api_router import VertexSettings, add_predict_route
from api.errors import install_error_handler
from api.settings import ApiSettings


def add_routes(app: Sanic, settings: ApiSettings, ui: Blueprint) -> None:
    for family in FAMILIES:
        app.blueprint(family.blueprint, url_prefix=settings.api_prefix or None)
    app.blueprint(ui)  # its routes carry the prefix themselves (`/` is the prefix's root)
    vertex = VertexSettings.from_env(os.environ)
    if vertex.enabled:  # after every other route: /predict dispatches to them
        add_predict_route(app, vertex, settings.api_prefix)
    install_error_handler(app)
