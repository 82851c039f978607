"""API keys: `Authorization: Bearer <key>` or `x-api-key`, as llama-server checks them."""

from __future__ import annotations

from pathlib import Path

from sanic import Request
from sanic.response import HTTPResponse

from api.errors import error_response
from scheduler.errors import AuthenticationFailed

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})


def load_api_keys(keys: list[str], key_file: str | None) -> frozenset[str]:
    found = {k for k in keys if k}
    if key_file:
        for line in Path(key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found.add(line)
    return frozenset(found)


def presented_key(request: Request) -> str:
    key = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    return key.removeprefix("Bearer ")


def check_api_key(request: Request, keys: frozenset[str]) -> HTTPResponse | None:
    if not keys or request.path in PUBLIC_PATHS or request.method == "OPTIONS":
        return None
    if presented_key(request) in keys:
        return None
    return error_response(AuthenticationFailed("Invalid API Key"))
