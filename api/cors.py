"""CORS as llama-server does it: an Allow-Origin on every response, preflights answered before
authentication (browsers send no Authorization header with them).

One deliberate improvement: a list of origins (`--cors-origins a,b`) is matched against the
request's Origin, and only a match is echoed (llama-server sends the list itself, which browsers
reject)."""

from __future__ import annotations

from urllib.parse import urlsplit

from sanic import Request
from sanic.response import HTTPResponse, text

from api.settings import ApiSettings

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def effective_origins(settings: ApiSettings, tools_enabled: bool = False) -> list[str]:
    """--cors-origins; when built-in tools or MCP servers are on (--tools, --agent,
    --mcp-servers-*; `tools_enabled` says so too) and it was not given, `localhost` (the
    spec's CORS section). --ui-mcp-proxy alone keeps the default, as in llama-server."""
    tools_enabled = tools_enabled or settings.tools_on()
    if tools_enabled and "cors_origins" not in settings.model_fields_set:
        return ["localhost"]
    return settings.cors_origins


def is_local_origin(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and (parts.hostname or "") in LOCAL_HOSTS


def allowed_origin(settings: ApiSettings, origin: str, tools_enabled: bool = False) -> str | None:
    """The Access-Control-Allow-Origin for a request from `origin` (None: no header)."""
    origins = effective_origins(settings, tools_enabled)
    if "*" in origins:
        if settings.cors_credentials:
            return origin or None  # echo it, so that credentials work from any origin
        return "*"
    if not origin:
        return None
    if origin in origins or ("localhost" in origins and is_local_origin(origin)):
        return origin
    return None


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
        if origin != "*":
            response.headers["Vary"] = "Origin"
