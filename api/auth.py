"""API keys: `Authorization: Bearer <key>` or `x-api-key`, as llama-server checks them."""

from __future__ import annotations

import hmac

from sanic import Request
from sanic.response import HTTPResponse

from api.errors import error_response
from api.settings import read_key_file
from api.tenants.config import UNLIMITED, Tenant
from api.tenants.service import TenantDirectory
from scheduler.contract.errors import AuthenticationFailed

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/ready"})
"""/ready: ours, the pod's readiness probe (api/endpoints/fleet/api_router.py)."""


def load_api_keys(keys: list[str], key_file: str | None) -> frozenset[str]:
    found = {k for k in keys if k}
    if key_file:
        found |= read_key_file(key_file)
    return frozenset(found)


def presented_key(request: Request) -> str:
    key = request.headers.get("authorization") or request.headers.get("x-api-key") or ""
    return key.removeprefix("Bearer ")


def key_matches(presented: str, keys: frozenset[str]) -> bool:
    """Compare with every key in constant time: the answer's timing says nothing about how
    much of a key was right, nor which key was close."""
    given = presented.encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode())
    return found


def is_public(path: str, api_prefix: str) -> bool:
    """/health, /v1/health and /ready answer without a key, under --api-prefix too."""
    if api_prefix and path.startswith(api_prefix + "/"):
        path = path[len(api_prefix):]
    return path in PUBLIC_PATHS


def check_api_key(request: Request, keys: frozenset[str],
                  api_prefix: str = "") -> HTTPResponse | None:
    if not keys or request.method == "OPTIONS" or is_public(request.path, api_prefix):
        return None
    if key_matches(presented_key(request), keys):
        return None
    return error_response(AuthenticationFailed("Invalid API Key"))


def request_tenant(request: Request, directory: TenantDirectory,
                   api_prefix: str = "") -> Tenant | None:
    """The tenant of the request's key; the default tenant for a request that needs none
    (OPTIONS, /health, or no key configured); None for a wrong or missing key (401)."""
    if not directory.auth_on or request.method == "OPTIONS" or is_public(request.path,
                                                                          api_prefix):
        return UNLIMITED
    return directory.by_key(presented_key(request))
