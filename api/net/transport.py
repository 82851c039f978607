"""An httpx transport that connects only where the FetchPolicy allows: each request (each
redirect hop is one) has its host resolved here, every address checked, and the connection made
to the checked address itself (the `Host` header and TLS's server name stay the host's), so a
name that resolves again to another address between the check and the connection (DNS
rebinding) cannot reach it."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx

from api.net.policy import FetchPolicy


class GuardedTransport(httpx.AsyncBaseTransport):
    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self.inner = httpx.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        port = request.url.port or (443 if request.url.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port,
                                                                 type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host}: {exc}", request=request) from None
        address = self.policy.check(host, [str(info[4][0]) for info in infos])
        extensions: dict[str, Any] = dict(request.extensions)
        if request.url.scheme == "https":
            extensions.setdefault("sni_hostname", host)
        pinned = httpx.Request(request.method, request.url.copy_with(host=address),
                               headers=request.headers, stream=request.stream,
                               extensions=extensions)
        return await self.inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self.inner.aclose()


def guarded_client(policy: FetchPolicy, timeout: float) -> httpx.AsyncClient:
    """A client for a caller's URLs: redirects followed (each hop checked) up to the policy's
    bound, no proxy from the environment, `timeout` per operation."""
    return httpx.AsyncClient(transport=GuardedTransport(policy), follow_redirects=True,
                             max_redirects=policy.max_redirects, timeout=timeout,
                             trust_env=False)
