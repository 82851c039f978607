"""Google Vertex AI's custom-container contract, as llama-server serves it (server-http.cpp,
register_gcp_compat): with AIP_MODE=PREDICTION, POST AIP_PREDICT_ROUTE (default /predict) takes
`{"instances": [...]}`, runs each instance on the route its `@requestFormat` names (a camelCase
alias such as `chatCompletions`, or a path) without streaming, and answers
`{"predictions": [...]}` in the instances' order. AIP_HEALTH_ROUTE adds a health route and
AIP_HTTP_PORT (default 8080) replaces --port."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from sanic import Request, Sanic
from sanic.exceptions import SanicException
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from api.errors import as_llamaq_error, error_body
from api.routing import Routes
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest, LlamaqError

MAX_INSTANCES = 128
FORMAT_KEY = "@requestFormat"


class VertexSettings(DeferredModel):
    """The AIP_* environment of a Vertex AI prediction container."""

    enabled: bool = False
    health_route: str = ""
    predict_route: str = "/predict"
    port: int = 8080

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> VertexSettings:
        def route(name: str, default: str) -> str:
            value = env.get(name) or default
            return value if not value or value.startswith("/") else "/" + value

        return cls(enabled=env.get("AIP_MODE", "") == "PREDICTION",
                   health_route=route("AIP_HEALTH_ROUTE", ""),
                   predict_route=route("AIP_PREDICT_ROUTE", "/predict"),
                   port=int(env.get("AIP_HTTP_PORT") or 8080))


def request_format(path: str) -> str:
    """The camelCase alias of a route: "/v1/chat/completions" → "chatCompletions",
    "/apply-template" → "applyTemplate" (llama-server's path_to_gcp_format)."""
    if path.startswith("/v1") and len(path) > 3:
        path = path[3:]
    out, upper = [], False
    for char in path.lstrip("/"):
        if char in ":<":  # a path parameter
            break
        if char in "/-_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)


def add_predict_route(app: Sanic, vertex: VertexSettings, prefix: str) -> None:
    """Register the predict route (and the health alias) on `app`; call after the other
    routes are registered."""
    paths = [_route_path(route.uri, prefix) for route in app.router.routes]
    if vertex.predict_route in paths:
        raise SystemExit(f"AIP_PREDICT_ROUTE={vertex.predict_route} conflicts with an existing "
                         "llama-server route")
    by_alias: dict[str, str] = {}
    for path in sorted(set(paths), key=lambda p: not p.startswith("/v1/")):
        by_alias.setdefault(request_format(path), path)  # /v1 routes win a shared alias

    async def predict(request: Request) -> HTTPResponse:
        try:
            body = json.loads(request.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(str(exc)) from None
        if not isinstance(body, dict):
            raise InvalidRequest("request body must be a JSON object")
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise InvalidRequest("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise InvalidRequest(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        predictions = await asyncio.gather(*(
            _one(request, instance, by_alias, paths, prefix) for instance in instances))
        return json_response({"predictions": predictions})

    routes = Routes("vertex")
    routes.post(prefix + vertex.predict_route, name="vertex_predict")(predict)
    health = next((route.handler for route in app.router.routes
                   if _route_path(route.uri, prefix) == "/health"), None)
    if vertex.health_route and health is not None:
        routes.get(prefix + vertex.health_route, name="vertex_health")(health)
    app.blueprint(routes.blueprint)


def _route_path(uri: str, prefix: str) -> str:
    path = "/" + uri.lstrip("/")
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


async def _one(request: Request, instance: Any, by_alias: dict[str, str], paths: list[str],
               prefix: str) -> Any:
    """One instance's prediction: the route's JSON answer, or an error object."""
    if not isinstance(instance, dict):
        return error_body(InvalidRequest("each instance must be a JSON object"))
    name = instance.get(FORMAT_KEY)
    if not isinstance(name, str):
        return error_body(InvalidRequest(f"each instance must include a string {FORMAT_KEY}"))
    payload = {key: value for key, value in instance.items() if key != FORMAT_KEY}
    if "stream" in payload:
        payload["stream"] = False  # the predict route does not stream
    path = by_alias.get(name) or (name if name in paths else None)
    if path is None:
        return error_body(InvalidRequest(f"no handler registered for {FORMAT_KEY}: {name}"))
    try:
        return _answer(await _dispatch(request, prefix + path, payload))
    except LlamaqError as error:
        return error_body(error)
    except Exception as exc:  # anything a handler raised, rendered as that route would
        return error_body(as_llamaq_error(exc))


async def _dispatch(request: Request, path: str, payload: dict[str, Any]) -> HTTPResponse:
    """Run the handler of `path` on a copy of `request` whose body is `payload`."""
    router = request.app.router
    try:
        route, handler, params = router.get(path, "POST", None)
    except SanicException:
        route, handler, params = router.get(path, "GET", None)
    inner = Request(path.encode(), request.headers, request.version, "POST", request.transport,
                    request.app)
    inner.body = json.dumps(payload).encode()
    inner.route = route
    inner.ctx.tenant = request.ctx.tenant  # the instance runs as its caller, limits and all
    response = await handler(inner, **params)
    if response is None:
        raise InvalidRequest("predict route does not support streaming responses")
    return response


def _answer(response: HTTPResponse) -> Any:
    if not response.body:
        return None
    try:
        return json.loads(response.body)
    except ValueError:
        return response.body.decode("utf-8", errors="replace")
