"""--ui-mcp-proxy: the web UI's CORS proxy (llama-server's `server-cors-proxy.h`). GET/POST
`/cors-proxy?url=...` forwards the request to `url` (http or https only; no credentials in it),
with only the headers the client names as `x-llama-server-proxy-header-<name>`, and the body;
the answer comes back streamed, with its status and headers (less the hop-by-hop ones and the
target's own CORS headers: ours are added).

**Ours** (issue 43): the answer is served on the pod's origin, so it must not act there: it
carries `Content-Security-Policy: sandbox` (a page of the target runs no script with the web
UI's storage) and `X-Content-Type-Options: nosniff`, and none of the target's headers that
would change the pod's origin (cookies, Clear-Site-Data, HSTS, service workers, its own
policies); the target's Content-Type stays, so JSON and SSE answers work as before. The target
is reached only at addresses the FetchPolicy allows (api/net/: no private, loopback or
link-local address unless --fetch-allow lists it, on every redirect too), redirects are bounded,
and a request the proxy sends carries `x-llamaq-cors-proxy`, which the proxy refuses: a chain
of redirects back into the proxy stops at its first hop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from api.net.policy import FetchPolicy

if TYPE_CHECKING:
    import httpx

PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
LOOP_HEADER = "x-llamaq-cors-proxy"
NOT_FORWARDED = frozenset({"accept-encoding", "transfer-encoding", "content-length", "host",
                           LOOP_HEADER})
STRIPPED = frozenset({"server", "transfer-encoding", "content-length", "keep-alive",
                      "content-encoding", "connection",
                      # ours: what would act on the pod's origin
                      "set-cookie", "set-cookie2", "clear-site-data", "strict-transport-security",
                      "service-worker-allowed", "content-security-policy",
                      "content-security-policy-report-only", "x-content-type-options",
                      "refresh", "link", "alt-svc", "origin-agent-cluster", "permissions-policy",
                      "cross-origin-opener-policy", "cross-origin-embedder-policy",
                      "cross-origin-resource-policy", "x-frame-options", "content-disposition"})
SANDBOXED = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}
TIMEOUT_S = 600.0


class ProxyRefused(Exception):
    """A target URL the proxy does not go to (a 500, as llama-server answers)."""


def check_target(url: str) -> str:
    if "://" not in url:
        raise ProxyRefused("invalid URL: no scheme")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ProxyRefused(f"unsupported URL scheme: {parts.scheme}")
    if not parts.hostname:
        raise ProxyRefused("invalid target URL: missing host")
    if parts.username is not None or parts.password is not None:
        raise ProxyRefused("authentication in target URL is not supported")
    return url


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in headers.items():
        lowered = key.lower()
        if not lowered.startswith(PROXY_HEADER_PREFIX):
            continue
        name = key[len(PROXY_HEADER_PREFIX):]
        if name and name.lower() not in NOT_FORWARDED:
            out[name] = value
    return out


@dataclass
class ProxiedResponse:
    status: int
    headers: dict[str, str]
    content_type: str | None
    body: AsyncIterator[bytes]


async def forward(method: str, url: str, headers: dict[str, str], body: bytes,
                  client: httpx.AsyncClient) -> ProxiedResponse:
    """Open the target's answer (httpx errors propagate: a 500 to the client)."""
    request = client.build_request(method, check_target(url),
                                   headers={**forwarded_headers(headers), LOOP_HEADER: "1"},
                                   content=body if method == "POST" else None)
    response = await client.send(request, stream=True)
    kept = {k: v for k, v in response.headers.items()
            if k.lower() not in STRIPPED and not k.lower().startswith("access-control-")
            and k.lower() != "content-type"}
    kept.update(SANDBOXED)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    return ProxiedResponse(response.status_code, kept, response.headers.get("content-type"),
                           chunks())


def new_client(policy: FetchPolicy) -> httpx.AsyncClient:
    # imported here, not at the top: httpx (with the click, pygments and rich its CLI loads)
    # costs an api pod ~30 ms of CPU at start, and only a fetch needs it
    from api.net.transport import guarded_client

    return guarded_client(policy, TIMEOUT_S)
