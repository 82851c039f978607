"""GET /tools (the pod's tools) and POST /tools (run one), as llama-server's
(`server-tools.cpp`); 403 `feature_disabled` when neither --tools nor an MCP server is on.
GET/POST /cors-proxy: the web UI's MCP proxy (--ui-mcp-proxy, `api/tools/cors_proxy.py`).
The tools run on this api pod (api/tools/); no worker is involved."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from urllib.parse import urlsplit

from sanic import Request
from sanic.response import HTTPResponse, json

from api.auth import presented_key
from api.body import raw_body
from api.endpoints.tools.protocol import ToolCallRequest, read_call
from api.endpoints.tools.render import (
    bad_request,
    chunk_event,
    done_event,
    feature_disabled,
    forbidden,
    server_error,
    unsupported_media_type,
)
from api.net.policy import AddressRefused
from api.routing import Routes
from api.services import services
from api.sse import open_stream, sse_data
from api.tools.cors_proxy import LOOP_HEADER, ProxyRefused, forward, new_client
from api.tools.errors import (
    ToolArgumentError,
    ToolRuntimeError,
    ToolRuntimeForbidden,
    UnknownToolError,
)
from api.tools.paths import OutsideRootError
from api.tools.service import CallHeaders, ToolsService
from api.tools.tool import ServerTool, ToolStream
from scheduler.contract.errors import PermissionDenied, ServerError

log = logging.getLogger(__name__)
routes = Routes("tools")


def _service(request: Request) -> ToolsService | None:
    service: ToolsService | None = services(request).tools
    return service


def key_id(request: Request) -> str:
    """Who called, for the log: a digest of the API key (never the key), `-` without keys."""
    if not services(request).api_keys:
        return "-"
    return "key-" + hashlib.sha256(presented_key(request).encode()).hexdigest()[:12]


def is_json(request: Request) -> bool:
    """ours: a call's body is `application/json`, which a page of another site cannot send
    without a CORS preflight (text/plain, a form or a typeless blob could run a command)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media_type == "application/json"


def call_headers(request: Request) -> CallHeaders:
    h = request.headers
    return CallHeaders(h.get("x-tool-cwd", ""), h.get("x-tool-runtime", ""),
                       h.get("x-resp-type", ""), key_id(request))


@routes.get("/tools", admin="/tools")
async def list_tools(request: Request) -> HTTPResponse:
    service = _service(request)
    if service is None:
        return feature_disabled()
    return json(service.listing())


@routes.post("/tools", body=ToolCallRequest, guarded=True, admin="/tools")
async def call_tool(request: Request) -> HTTPResponse | None:
    service = _service(request)
    if service is None:
        return feature_disabled()
    if not is_json(request):
        return unsupported_media_type()
    try:
        service.check_runtime_header(request.headers.get("x-tool-runtime", ""))
        body = read_call(raw_body(request))
        tool = service.find(body.tool, body.stream)
        if body.stream:
            return await _stream(request, service, tool, body)
        call = await service.prepare(tool, body.params, call_headers(request))
        return json(await service.invoke(tool, call))
    except ToolArgumentError as exc:
        return bad_request(str(exc))
    except UnknownToolError as exc:
        return bad_request(str(exc), status=404)
    except OutsideRootError as exc:
        return bad_request(str(exc))
    except ToolRuntimeError as exc:
        return server_error(str(exc))
    except ToolRuntimeForbidden as exc:
        return forbidden(str(exc))


async def _stream(request: Request, service: ToolsService, tool: ServerTool,
                  body: ToolCallRequest) -> HTTPResponse | None:
    """SSE: a chunk event for each piece of output, then `done`; a client that leaves stops
    the command."""
    chunks: asyncio.Queue[str | None] = asyncio.Queue()
    listening = True
    stream = ToolStream(push=lambda c: chunks.put_nowait(c) if c else None,
                        alive=lambda: listening)
    headers = call_headers(request)
    error = ""

    async def run() -> None:
        nonlocal error
        try:  # as llama-server: a runtime that cannot be used ends the stream with an error
            call = await service.prepare(tool, body.params, headers, stream)
            await service.invoke(tool, call)
        except (ToolArgumentError, ToolRuntimeError, OutsideRootError) as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("tool %s failed", tool.tool_name)
            error = str(exc) or "An unknown error occurred"
        finally:
            chunks.put_nowait(None)

    response = await open_stream(request)
    task = asyncio.create_task(run())
    try:
        while (chunk := await chunks.get()) is not None:
            await response.send(sse_data(chunk_event(chunk)))
        await response.send(sse_data(done_event(error)))
        await response.eof()
    except Exception:  # the client left
        listening = False
        raise
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    return None


@routes.get("/cors-proxy", guarded=True, admin="/cors-proxy")
async def cors_proxy_get(request: Request) -> HTTPResponse | None:
    return await _proxy(request, "GET")


@routes.post("/cors-proxy", guarded=True, admin="/cors-proxy")
async def cors_proxy_post(request: Request) -> HTTPResponse | None:
    return await _proxy(request, "POST")


async def _proxy(request: Request, method: str) -> HTTPResponse | None:
    # imported here, not at the top: httpx (with the click, pygments and rich its CLI loads)
    # costs an api pod ~30 ms of CPU at start, and only a fetch needs it
    import httpx

    settings = services(request).settings
    if not settings.cors_proxy_on():
        return feature_disabled()
    url = request.args.get("url", "")
    if LOOP_HEADER in request.headers:
        raise PermissionDenied("a request of the CORS proxy cannot go through it again")
    try:
        async with new_client(settings.fetch_policy()) as client:
            answer = await forward(method, url, dict(request.headers), raw_body(request),
                                   client)
            log.info("cors proxy: key=%s %s %s -> %d", key_id(request), method,
                     url.split("?")[0], answer.status)
            response = await request.respond(status=answer.status, headers=answer.headers,
                                             content_type=answer.content_type)
            assert response is not None
            async for chunk in answer.body:
                await response.send(chunk)
            await response.eof()
    except ProxyRefused as exc:
        raise ServerError(str(exc)) from None
    except AddressRefused:
        host = urlsplit(url).hostname
        raise PermissionDenied(f"target address not allowed: {host} (only public addresses, "
                               "or what --fetch-allow lists)") from None
    except httpx.HTTPError as exc:
        raise ServerError(f"proxy request failed: {type(exc).__name__}: {exc}") from None
    return None
