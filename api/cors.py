"""CORS as llama-server does it: an Allow-Origin on every response, preflights answered before
authentication (browsers send no Authorization header with them)."""

from __future__ import annotations

from urllib.parse import urlsplit

from sanic import Request
from sanic.response import HTTPResponse, text

from api.settings import ApiSettings


def allowed_origin(settings: ApiSettings, origin: str) -> str | None:
    origins = settings.cors_origins
    if origins == ["*"] and settings.cors_credentials:
        return origin or None  # echo it, so that credentials work from any origin
    if origins == ["localhost"]:
        host = urlsplit(origin).hostname or ""
        return origin if host in ("localhost", "127.0.0.1", "::1") else None
    return ",".join(origins)


def preflight(request: Request, settings: ApiSettings) -> HTTPResponse | None:
    if request.method != "OPTIONS":
        return None
    return text("", content_type="text/html", headers={
        "Access-Control-Allow-Credentials": "true" if settings.cors_credentials else "false",
        "Access-Control-Allow-Methods": ", ".join(settings.cors_methods),
        "Access-Control-Allow-Headers": ", ".join(settings.cors_headers),
    })


def add_allow_origin(request: Request, response: HTTPResponse, settings: ApiSettings) -> None:
    origin = allowed_origin(settings, request.headers.get("origin", ""))
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
