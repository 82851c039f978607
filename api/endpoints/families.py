"""Every endpoint family's routes, in the order the app registers them (api/app/routes.py)."""


from __future__ import annotations

from api.endpoints.anthropic import api_router as anthropic
from api.endpoints.batches import api_router as batches
from api.endpoints.embeddings import api_router as embeddings
from api.endpoints.extras import api_router as extras
from api.endpoints.files import api_router as files
from api.endpoints.fleet import api_router as fleet
from api.endpoints.lora import api_router as lora
from api.endpoints.models import api_router as models
from api.endpoints.models import downloads as model_downloads
from api.endpoints.monitor import api_router as monitor
from api.endpoints.native import api_router as native
from api.endpoints.openai import api_router as openai
from api.endpoints.openapi import api_router as openapi
from api.endpoints.streams import api_router as streams
from api.endpoints.systemone import api_router as systemone
from api.endpoints.templates import api_router as templates
from api.endpoints.tools import api_router as tools
from api.routing import Routes

FAMILIES: tuple[Routes, ...] = (
    native.routes, monitor.routes, openai.routes, templates.routes, anthropic.routes,
    embeddings.routes, extras.routes, lora.routes, systemone.routes, fleet.routes, streams.routes,
    files.routes, batches.routes, models.routes, openapi.routes, model_downloads.routes,
    tools.routes,
)
